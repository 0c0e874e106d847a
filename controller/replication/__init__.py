"""rasd.controller.replication: several replicas, one leader (election and relay)."""
