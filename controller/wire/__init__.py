"""rasd.controller.wire: every protobuf <-> domain conversion of the controller."""
