"""rasd.validation: the in-field GPU correctness suite that rasd-validate runs on a node."""
