"""The NInfer Kubernetes operator: reconciles `NInferDeployment` resources (ninfer.io/v1alpha1).

Modules:
  crd.py         the CustomResourceDefinition (schema, subresources, printer columns) as a pure function
  resources.py   pure spec -> manifest renders (verification Job, Deployment, Service, ConfigMap, Ingress)
  conditions.py  status conditions and the phase roll-up (pure)
  placement.py   the GPU-node index and the PlacementSatisfiable decision (pure)
  kube.py        the only module that talks to the API server for children (create / read / replace)
  handlers.py    kopf handlers: thin, idempotent, call the modules above
"""

from __future__ import annotations

GROUP = "ninfer.io"
VERSION = "v1alpha1"
PLURAL = "ninferdeployments"
KIND = "NInferDeployment"
SHORT_NAME = "ninfer"
