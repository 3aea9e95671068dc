// Package controlplane runs a private etcd and kube-apiserver on loopback
// ports, from binaries given to dp-bench (the e2e node's,
// e2e/local/build-binaries.sh), with their data and certificates (a CA,
// the API server's serving certificate, a client of system:masters, the
// service-account key) in a directory of their own; and, for the fleet,
// more control-plane binaries against it (Run). The DRA session and the
// fleet drive their drivers against it.
package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
)

// ControlPlane is a private etcd and kube-apiserver: a DRA driver
// publishes ResourceSlices to it and reads the ResourceClaims it is asked
// to prepare.
type ControlPlane struct {
	// Kubeconfig is a kubeconfig file with a client certificate of the
	// group system:masters, for the drivers under test.
	Kubeconfig string
	// Client is dp-bench's own client, not rate-limited.
	Client *apiclient.Client
	// Version is the API server's version ("" when /version did not say).
	Version string
	// Etcd and APIServer are the processes.
	Etcd, APIServer *proc.Proc

	dir string
}

// Options say what to run.
type Options struct {
	// APIServer and Etcd are the binaries.
	APIServer, Etcd string
	// FeatureGates is kube-apiserver's --feature-gates ("": none).
	FeatureGates string
	// Ready bounds the wait for /readyz.
	Ready time.Duration
	// Args are more kube-apiserver flags (the fleet's audit log).
	Args []string
}

// Start starts etcd and kube-apiserver and waits until the API server is
// ready. Stop ends both and removes their directory.
func Start(ctx context.Context, o Options) (*ControlPlane, error) {
	for _, b := range []struct{ flag, path string }{{"-kube-apiserver", o.APIServer}, {"-etcd", o.Etcd}} {
		if b.path == "" {
			return nil, fmt.Errorf("%s: not given", b.flag)
		}
		if fi, err := os.Stat(b.path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%s=%q: not an executable file", b.flag, b.path)
		}
	}
	dir, err := os.MkdirTemp("", "dpb-api")
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{dir: dir}
	fail := func(err error) (*ControlPlane, error) {
		cp.Stop()
		return nil, err
	}
	pki, err := newPKI(dir)
	if err != nil {
		return fail(err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return fail(err)
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	cp.Etcd, err = Run(o.Etcd, "--name", "dp-bench", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "dp-bench="+peer, "--listen-metrics-urls", "", "--log-level", "warn")
	if err != nil {
		return fail(fmt.Errorf("etcd: %w", err))
	}
	args := []string{"--etcd-servers", client,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", strconv.Itoa(ports[2]),
		"--tls-cert-file", pki.serverCert, "--tls-private-key-file", pki.serverKey, "--client-ca-file", pki.caCert,
		"--service-account-key-file", pki.saKey, "--service-account-signing-key-file", pki.saKey,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", "10.96.0.0/16", "--endpoint-reconciler-type", "none",
		"--authorization-mode", "RBAC", "--cert-dir", filepath.Join(dir, "certs"), "--profiling=false"}
	if o.FeatureGates != "" {
		args = append(args, "--feature-gates", o.FeatureGates)
	}
	args = append(args, o.Args...)
	cp.APIServer, err = Run(o.APIServer, args...)
	if err != nil {
		return fail(fmt.Errorf("kube-apiserver: %w", err))
	}
	host := fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	if cp.Client, err = apiclient.New(host, pki.caPEM, pki.clientPEM, pki.clientKeyPEM); err != nil {
		return fail(err)
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kubeconfig(host, pki), 0o600); err != nil {
		return fail(err)
	}
	if err := cp.waitReady(ctx, o.Ready); err != nil {
		return fail(err)
	}
	var v apiclient.Version
	if err := cp.Client.Do(ctx, http.MethodGet, "/version", nil, &v); err == nil {
		cp.Version = v.GitVersion
	}
	return cp, nil
}

// waitReady polls /readyz until it answers ok, a process exits or the
// timeout passes.
func (cp *ControlPlane) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		for name, p := range map[string]*proc.Proc{"etcd": cp.Etcd, "kube-apiserver": cp.APIServer} {
			if p.Exited() {
				return fmt.Errorf("%s exited: %w: %s", name, p.Err(), p.LogTail(800))
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var body string
		err := cp.Client.Do(rctx, http.MethodGet, "/readyz", nil, &body)
		cancel()
		switch {
		case err == nil && body == "ok":
			return nil
		case err == nil:
			last = fmt.Errorf("/readyz: %q", body)
		default:
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready within %s: %w: %s", timeout, last, cp.APIServer.LogTail(800))
		}
		if err := proc.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// Stop ends the API server, then etcd, and removes their directory.
func (cp *ControlPlane) Stop() {
	for _, p := range []*proc.Proc{cp.APIServer, cp.Etcd} {
		if p != nil {
			_, _ = p.Terminate(10 * time.Second)
		}
	}
	_ = os.RemoveAll(cp.dir)
}

// kubeconfig is a kubeconfig for the API server at host with pki's client
// certificate, the data inline.
func kubeconfig(host string, p *pki) []byte {
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: dp-bench
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: dp-bench
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: dp-bench
  context: {cluster: dp-bench, user: dp-bench}
current-context: dp-bench
`, host, b64(p.caPEM), b64(p.clientPEM), b64(p.clientKeyPEM))
}

// Run starts a control-plane binary with args (and PATH, nothing else of
// dp-bench's environment); the tail of its output is kept for errors.
func Run(bin string, args ...string) (*proc.Proc, error) {
	return proc.Start(append([]string{bin}, args...), []string{"PATH=" + os.Getenv("PATH")}, nil, "")
}

// freePorts returns n loopback TCP ports free now.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// pki holds the files and PEM blocks of the control plane's certificates.
type pki struct {
	caCert, serverCert, serverKey, saKey string
	caPEM, clientPEM, clientKeyPEM       []byte
}

// newPKI makes, in dir, a CA, the API server's serving certificate for
// 127.0.0.1, a client certificate of the group system:masters and the
// service-account signing key; all ECDSA P-256, valid for a day.
func newPKI(dir string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dp-bench-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	issue := func(serial int64, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: subject, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
	}
	p := &pki{caCert: filepath.Join(dir, "ca.crt"), serverCert: filepath.Join(dir, "apiserver.crt"), serverKey: filepath.Join(dir, "apiserver.key"),
		saKey: filepath.Join(dir, "sa.key"), caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	srv, srvKey, err := issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	if p.clientPEM, p.clientKeyPEM, err = issue(3, pkix.Name{CommonName: "dp-bench", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{p.caCert: p.caPEM, p.serverCert: srv, p.serverKey: srvKey,
		p.saKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER})}
	for path, b := range files {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}
