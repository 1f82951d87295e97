// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the
// version that k8s.io/kubernetes pins (see ../go.mod). It exists only so that
// tests/envtest/build.sh can build etcd in the same module as kube-apiserver.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
