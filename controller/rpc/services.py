"""Registers the controller's rasd.api.v1 services on a gRPC server (the generated stubs stay in `rpc`)."""

from __future__ import annotations

import grpc

from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.controller.rpc import admin_service, agent_service


def add_services(
    server: grpc.aio.Server, agents: agent_service.AgentService, admin: admin_service.AdminService
) -> None:
    """Serve AgentService and AdminService on server."""
    agent_grpc.add_AgentServiceServicer_to_server(agents, server)
    admin_grpc.add_AdminServiceServicer_to_server(admin, server)
