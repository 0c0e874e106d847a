"""rasd.cli: rasctl, the operator's command line: a gRPC client of the controller's AdminService."""
