// Package kubeclient makes the API clients of the commands that talk to
// the API server (the DRA driver, the bind marker), apart from
// internal/command so that the device plugin, which never does, does not
// link client-go.
package kubeclient

import (
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// New makes an API client: from kubeconfig, or in-cluster when empty; each
// with a client-side rate limit of its own.
func New(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}
