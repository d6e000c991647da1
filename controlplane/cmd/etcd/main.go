// Command etcd is etcd's own server entry point (etcdmain), built from go.etcd.io/etcd/server at the
// version k8s.io/kubernetes requires, so kube-apiserver talks to the etcd it was released against.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
