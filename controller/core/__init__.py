"""rasd.controller.core: pure decisions (classification, escalation, blast radius, power).

Pure: no grpc, sqlalchemy, logging, metrics or clock reads. Time comes in as `now`; effects come out
as data for the executors.
"""
