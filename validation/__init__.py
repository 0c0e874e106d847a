"""rasd.validation: the in-field GPU correctness (SDC) suite that rasd-validate runs on a node.

Owns the checks V0-V6 (``checks/``: each a run() adapter plus a pure judge()), the suites and their
time budgets (``registry``), the runner and JSON report (``runner``), fault injection (``faults``),
the V2 golden store (``golden``) and the CLI (``main``). torch is imported lazily, only by run paths;
everything else, including ``rasd-validate --help``, works without the ``rasd[validate]`` extra.
The controller-side orchestration (accusation, reruns, quarantine) lives in rasd.controller.
"""
