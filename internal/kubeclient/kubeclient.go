// Package kubeclient makes the API clients of the commands that talk to
// the API server (the DRA driver, the bind marker), apart from
// internal/command so that the device plugin, which never does, does not
// link client-go.
package kubeclient

import (
	"k8s.io/client-go/kubernetes"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// config reads kubeconfig, or the in-cluster configuration when empty.
func config(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// New makes an API client: from kubeconfig, or in-cluster when empty; each
// with a client-side rate limit of its own.
func New(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := config(kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// DRA is the DRA driver's clients, each with a client-side rate limit of
// its own, so that neither of the last two holds up the first: Client,
// the kubelet plugin helper's (it reads the claim of every
// NodePrepareResources) and the slices'; Status, the claims' status
// writes'; Cleanup, the stale-claim clean-up's (a read of every prepared
// claim once a minute). The last two are of resource.k8s.io/v1 alone: a
// whole clientset each cost a driver's start time and memory for groups
// they never use.
type DRA struct {
	Client          kubernetes.Interface
	Status, Cleanup resourceclient.ResourceV1Interface
}

// NewDRA makes the DRA driver's clients from one reading of kubeconfig
// (in-cluster when empty). They share the connection to the API server
// (client-go's transport cache): the rate limits are their own, the
// connection is not.
func NewDRA(kubeconfig string) (DRA, error) {
	rc, err := config(kubeconfig)
	if err != nil {
		return DRA{}, err
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return DRA{}, err
	}
	s, err := resourceclient.NewForConfig(rc)
	if err != nil {
		return DRA{}, err
	}
	cl, err := resourceclient.NewForConfig(rc)
	if err != nil {
		return DRA{}, err
	}
	return DRA{Client: c, Status: s, Cleanup: cl}, nil
}
