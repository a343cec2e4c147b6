// kube-multicall: kube-apiserver, kube-controller-manager, kube-scheduler and kubelet of one Kubernetes tree in one
// static binary, chosen by the name it is called by (a link named after the component) or by its first argument
// (`kube-multicall kubelet --config ...`). The GPU cluster kit carries this one file instead of four: the four
// share most of their code, and the device tool's carried tree is limited to 64 MiB.
// Built by benchmarks/gpu_cluster_prepare.py inside the tree `scripts/test-cluster build` fetched, as cmd/kube-multicall.
package main

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // the client-go metrics plugins (restclient among them)
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 kubelet.NewKubeletCommand,
}

func main() {
	rand.Seed(time.Now().UnixNano())
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if _, ok := components[name]; !ok && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	newCommand, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "kube-multicall: call it as one of %v (a link of that name, or the first argument)\n", names)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	// as kube-scheduler's own main does; the others' flags have no word separators to normalise
	pflag.CommandLine.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	logs.InitLogs()
	defer logs.FlushLogs()
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
