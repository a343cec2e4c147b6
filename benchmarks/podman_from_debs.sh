# Sourced by the benchmark scripts: podman from carried Debian packages (no engine is installed on the
# lent GPU machine and nothing can be downloaded there). Needs DEBS (folder of .debs), MD (markdown
# file to append to) and md() from the caller. After setup_podman, `podman` on PATH is a wrapper and
# GPUVS_PODMAN_ARGS holds the storage flags gpuvs passes to every podman command.
setup_podman() {
  if ls "$DEBS"/*.deb >/dev/null 2>&1; then
    local P=/tmp/gpuvs-podman
    rm -rf "$P/root"; mkdir -p "$P/root" "$P/bin"
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$P/root" || return 1; done
    local L="$P/root/usr/lib/x86_64-linux-gnu:$P/root/lib/x86_64-linux-gnu"
    # podman starts conmon with a clean environment: conmon (and runc under it) get their library path here
    cat > "$P/containers.conf" <<CONF
[containers]
seccomp_profile = "$P/root/usr/share/containers/seccomp.json"
[engine]
conmon_path = ["$P/root/usr/bin/conmon"]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
conmon_env_vars = ["PATH=/usr/bin:/bin:/usr/sbin:/sbin", "LD_LIBRARY_PATH=$L"]
[engine.runtimes]
runc = ["$P/root/usr/sbin/runc"]
CONF
    # the carried libraries are for podman alone: a wrapper, so that no other process (the host arm's
    # worker above all) runs with them
    cat > "$P/bin/podman" <<WRAP
#!/bin/sh
export LD_LIBRARY_PATH="$L\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" CONTAINERS_CONF="$P/containers.conf"
exec "$P/root/usr/bin/podman" "\$@"
WRAP
    chmod +x "$P/bin/podman"
    export PATH="$P/bin:$PATH"
    export GPUVS_PODMAN_ARGS="--storage-driver vfs --root $P/store --runroot $P/run"
    md "podman unpacked from \`$DEBS\` ($(ls "$DEBS"/*.deb | wc -l) packages) into $P; wrapper $P/bin/podman;" \
       "\`GPUVS_PODMAN_ARGS=\"$GPUVS_PODMAN_ARGS\"\`; containers.conf:" "" '```' "$(cat "$P/containers.conf")" '```'
  elif command -v podman >/dev/null; then
    md "podman from PATH: $(command -v podman)"
  else
    return 1
  fi
  md "" "\`$(podman --version 2>&1)\`"
  podman ${GPUVS_PODMAN_ARGS:-} info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}} cgroup {{.Host.CgroupsVersion}}' \
    >> "$MD" 2>&1 || return 1
}

