"""gpuvs deploy [--dry-run] [--delete [--keep-labels]] [--overlay DIR|none] [--condition] [--image IMAGE] [--agent-arg ARG ...] [--kubeconfig F] [--context C]: the
agent's manifests (deploy/, carried by the installed package) applied to a cluster, printed, or removed. Applied,
they come with the Secret gpuvs-agent-token (a random token for the agent's POST /runs, created once, kept after)."""

from __future__ import annotations

import sys

from gpuvs.cli.declaration import Args, Command, Group
from gpuvs.errors import UsageError
from gpuvs.params import Param

DEPLOY_OPTIONS = (
    Param("dry_run", bool, False, "print the manifests (YAML), apply nothing"),
    Param("delete", bool, False, "remove what deploy applied: the agent's Deployment first, waited for until its pod "
          "is gone (the agent takes its gpuvs.io/testing marks off; one still left is removed here), then what gpuvs "
          "wrote on the nodes (gpuvs.io/ labels and annotations, the taint gpuvs.io/slow, the condition "
          "GpuvsPerformance), then the namespace with its store's claim and pods, the ClusterRole, its binding and "
          "the PriorityClass"),
    Param("keep_labels", bool, False, "with --delete: keep the nodes' gpuvs.io/ verdict labels and annotations "
          "(the taint, the condition and gpuvs.io/testing are removed all the same)"),
    Param("image", str, None, "the agent's image (default: localhost/gpuvs:VERSION, as deploy/ names it)"),
    Param("agent_arg", str, None, "one more argument of `gpuvs agent` (repeat: --agent-arg=--every --agent-arg=1h); "
          "--listen :PORT moves the container's port, which the probes and the Service follow", multiple=True),
    Param("overlay", str, None, "a kustomization folder over deploy/ (bases or resources, patchesJson6902; e.g. "
          "overlays/test-cluster), remembered: a later deploy without --overlay keeps it, --overlay none drops it"),
    Param("condition", bool, False, "also deploy/node-status (patch nodes/status for the NodeCondition, Events on the "
          "nodes in default) and the agent's --condition; --delete always removes them"),
    Param("kubeconfig", str, None, "default: KUBECONFIG, ~/.kube/config or the in-cluster service account"),
    Param("context", str, None, "kubeconfig context"),
)


def deploy(args: Args) -> int:
    from gpuvs.agent import deploy as manifests

    if args["dry_run"] and args["delete"]:
        raise UsageError("--dry-run and --delete: give one of them")
    if args["keep_labels"] and not args["delete"]:
        raise UsageError("--keep-labels goes with --delete only")
    from gpuvs.agent import overlay as overlays

    given = args["overlay"]
    overlay = overlays.read(given) if given not in (None, overlays.NONE) else None  # bad input before connecting
    said: list[tuple[str, str]] = []
    cluster = last = None
    if not args["dry_run"]:
        from gpuvs.kube.client import connect

        cluster = connect(args["kubeconfig"], args["context"])
        last = manifests.remembered(cluster)
        if given is None:
            overlay = last
            if overlay is not None and not args["delete"]:
                said.append((f"overlay {overlay.source}", f"kept from the last deploy (--overlay {overlays.NONE} "
                                                          "drops it)"))
    objs = manifests.manifests(args["image"], list(args["agent_arg"] or []),
                               condition=args["condition"] or args["delete"], overlay=overlay)
    if cluster is None:
        sys.stdout.write(manifests.render(objs))
        return 0
    ours = {(m["kind"], m["metadata"]["name"]) for m in objs}
    stale = [m for m in (last.objects if last is not None else []) if (m["kind"], m["metadata"]["name"]) not in ours]
    if args["delete"]:
        done = manifests.delete(cluster, stale + objs, keep_labels=args["keep_labels"])
    else:  # what the last overlay added and this deploy does not is deleted after
        done = said + manifests.apply(cluster, manifests.with_token(objs))
        done += manifests.delete(cluster, stale, clear_nodes=False)
    for what, how in done:
        print(f"{what} {how}")
    left = [what for what, how in done if manifests.NOT_REMOVED in how or how.startswith("not cleared")]
    if left:
        print(f"gpuvs deploy --delete: gpuvs's marks are left on {', '.join(sorted(set(left)))} (above: why)",
              file=sys.stderr)
        return 1
    return 0


COMMAND = Command(
    "deploy", "Deploy gpuvs's agent into a cluster (the manifests of deploy/), print them, or remove them.", deploy,
    groups=(Group("deploy options", DEPLOY_OPTIONS, "deploy"),),
    notes="The same objects as `kubectl apply -k deploy/`. See docs/deploy.md.",
)
