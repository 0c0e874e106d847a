"""rasd.agent.core: the agent's pure vocabulary and decisions.

Pure: no pynvml, grpc, sqlalchemy, logging, clock reads or file access. Time comes in as an argument.
"""
