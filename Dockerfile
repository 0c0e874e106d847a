# syntax=docker/dockerfile:1
# rasd images. Not built in CI (no Docker engine there); the Helm chart (helm/rasd) runs them.
#   docker build -t rasd-controller .              # the controller (the default, last stage)
#   docker build --target agent -t rasd-agent .    # the node agent, for the chart's optional DaemonSet
# Both run as the non-root user rasd (uid 10001). The chart runs the agent as root on purpose (NVML
# power limits, GPU resets, /dev/kmsg); see helm/rasd/README.md.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- the wheel ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY common common
COPY agent agent
COPY controller controller
COPY cli cli
COPY sim sim
COPY validation validation
COPY proto proto
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- virtual environments (same base image and path as the final stages) -----------------------
FROM ${PYTHON_IMAGE} AS controller-venv
COPY --from=wheel /wheels /wheels
RUN python -m venv /opt/rasd \
 && /opt/rasd/bin/pip install --no-cache-dir "$(ls /wheels/rasd-*.whl)[postgres,kubernetes,bmc]"

FROM ${PYTHON_IMAGE} AS agent-venv
COPY --from=wheel /wheels /wheels
RUN python -m venv /opt/rasd \
 && /opt/rasd/bin/pip install --no-cache-dir "$(ls /wheels/rasd-*.whl)[nvml]"

# ---- runtime base ------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 rasd \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin rasd \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/rasd
ENV PATH=/opt/rasd/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# ---- the agent ---------------------------------------------------------------------------------
# NVML comes from the host's driver, injected by the NVIDIA container runtime (runtimeClassName
# nvidia). rasd-validate is installed but its torch backend is not (pip install 'rasd[validate]').
FROM runtime AS agent
COPY --from=agent-venv /opt/rasd /opt/rasd
USER 10001:10001
EXPOSE 8455
ENTRYPOINT ["rasd-agent"]

# ---- the controller (default target) -----------------------------------------------------------
FROM runtime AS controller
COPY --from=controller-venv /opt/rasd /opt/rasd
USER 10001:10001
WORKDIR /var/lib/rasd
EXPOSE 7443 9464
ENTRYPOINT ["rasd-controller"]
