"""What the fleet asks of the Kubernetes API beyond the pod environment: the nodes, and a last sweep of its pods.

The sweep deletes every pod of a fleet experiment however the run ended: those labelled gpuvs.io/experiment=ID.
For one release it also asks for gpuvs.experiment=ID, the label before."""

from __future__ import annotations

from gpuvs.environments.pod import EXPERIMENT, OLD_EXPERIMENT
from gpuvs.errors import UsageError
from gpuvs.fleet.execute.node_choice import NodeInfo, from_api
from gpuvs.kube import client


def nodes(cluster: client.Cluster) -> list[NodeInfo]:
    try:
        items = cluster.core.list_node(_request_timeout=15).items
    except Exception as exc:
        raise UsageError(f"gpuvs fleet cannot list the nodes of {cluster.host} ({cluster.source}): "
                         f"{client.api_message(exc)}") from None
    return [from_api(n) for n in items]


def sweep(cluster: client.Cluster, experiment_id: str) -> int:
    """Delete the pods labelled with this experiment that are left (none, normally); how many there were."""
    try:
        pods = {p.metadata.name: p for key in (EXPERIMENT, OLD_EXPERIMENT)
                for p in cluster.core.list_namespaced_pod(cluster.namespace, label_selector=f"{key}={experiment_id}",
                                                          _request_timeout=15).items}
        for pod in pods.values():
            cluster.core.delete_namespaced_pod(pod.metadata.name, cluster.namespace, grace_period_seconds=0,
                                               _request_timeout=15)
        return len(pods)
    except Exception:  # the sweep is a backstop: each trial already deleted its own pod
        return -1
