"""gpuvs agent: gpuvs inside the cluster, one replica (deploy/, docs/deploy.md). On a schedule (--every) and on
demand (POST /runs, with the API's token) it runs the functional validate suite and a fleet per configured workload on the nodes whose
GPUs nobody else has requested, writes the node labels `gpuvs fleet --label` writes, keeps every result in its
store, and serves /metrics in Prometheus's format (each node's drift against its own past too) and the
status page.

    config    the agent's settings (AgentConfig), checked before anything starts; --workload specs
    schedule  when the next run is due; the back-off while the API server is unreachable
    ledger    the agent's runs in the store (table agent_runs): queued, running, ok, failed, interrupted
    idle      which nodes may be tested (the scheduler asked through a hold pod), gpuvs.io/testing, the sweep
    runs      one run: idle nodes, validate, fleets (gpuvs's own commands as child processes), clean-up
    state     what the metrics show: the latest figures per node and workload, their drift, staleness, nodes gone
    metrics   the Prometheus collector over the state (prometheus-client)
    httpd     the HTTP server and its routes (/healthz, /readyz, /metrics, /runs, the status page at /), its limits
    auth      who may start a run: the bearer token of --token-file (the Secret gpuvs-agent-token), constant time
    public    what the open reads may say: reasons without the API server's address or the kubeconfig's path
    service   the agent: the loop, the run thread, signals
"""
