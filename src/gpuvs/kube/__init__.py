"""Kubernetes through the official client, imported only when a cluster is used (docs/internals.md lists the modules).

SLOW_TAINT is the taint `gpuvs fleet --taint` puts on a node found slower (fleet/cluster/taints.py).
Every pod gpuvs starts tolerates it (SLOW_TOLERATION), so a tainted node is measured again and untainted when well."""

SLOW_TAINT = "gpuvs.io/slow"
SLOW_TOLERATION = {"key": SLOW_TAINT, "operator": "Exists"}


def app_labels(component: str, **gpuvs_io: str) -> dict[str, str]:
    """The labels every pod gpuvs starts carries, by Kubernetes's conventions: app.kubernetes.io/{name, component,
    managed-by, version}, gpuvs=1 (every clean-up's selector) and gpuvs.io/KEY=VALUE for each keyword (KEY's _ as -)."""
    from gpuvs import __version__

    out = {"gpuvs": "1", "app.kubernetes.io/name": "gpuvs", "app.kubernetes.io/component": component,
           "app.kubernetes.io/managed-by": "gpuvs", "app.kubernetes.io/version": __version__[:63]}
    out.update({f"gpuvs.io/{k.replace('_', '-')}": v[:63] for k, v in gpuvs_io.items()})
    return out
