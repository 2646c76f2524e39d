"""The NInfer Kubernetes operator: reconciles `NInferDeployment` resources (ninfer.io/v1alpha1).

Modules:
  crd.py         the CustomResourceDefinition (schema, subresources, printer columns) as a pure function
  flags.py       the one spec -> ninfer-serve flag table, and which modes the server runs today (pure)
  names.py       child names that are always valid (pure)
  resources.py   pure spec -> workload renders (verification Job, Deployment, ConfigMap)
  routing.py     pure renders of the Service, InferencePool + HTTPRoute (Gateway API), legacy Ingress
  conditions.py  status conditions and the phase roll-up (pure)
  placement.py   the GPU-node index and the PlacementSatisfiable decision (pure)
  kube.py        the only module that talks to the API server (children, the resource's status)
  reconcile.py   one level-based pass over one resource: decisions, conditions, Events
  handlers.py    kopf triggers (spec changes, child and node watches, the resync loop) -> reconcile
"""

from __future__ import annotations

GROUP = "ninfer.io"
VERSION = "v1alpha1"
PLURAL = "ninferdeployments"
KIND = "NInferDeployment"
SHORT_NAME = "ninfer"
