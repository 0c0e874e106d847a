"""The Kubernetes adapter's child process: ``python -m rasd.controller.executors.quarantine.k8s_child <fd>``.

Its own module, which the package does not import, so that ``-m`` runs it fresh (`k8s_process.serve`).
"""

from __future__ import annotations

import multiprocessing.connection
import sys

from rasd.controller.executors.quarantine import k8s_process

if __name__ == "__main__":
    k8s_process.serve(multiprocessing.connection.Connection(int(sys.argv[1])))
