"""rasd.controller: the fleet's brain: ingest, classification, repairs, power, and the admin API."""
