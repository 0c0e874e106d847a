"""rasd.controller.rpc: thin gRPC servicers that convert wire messages and call the service layer."""
