package dra

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Rolling updates. With Options.RollingUpdateUID (the pod's UID) the
// helper names the driver's registration and DRA sockets after it
// (kubeletplugin.RollingUpdate), so that a new instance of the driver
// starts and registers while the old one still serves, and the kubelet
// uses either: a DaemonSet rolls with maxSurge 1 and no gap in which no
// claim can be prepared on the node. What the two share:
//   - the kubelet's calls: the helper serialises them across both
//     instances with a lock file in the plugin directory; the release of a
//     stale claim, which the helper does not call, takes it too
//     (preparer.serializeLock);
//   - the claim checkpoint: each call reads it again when the other
//     instance saved it since (Checkpoint.Refresh);
//   - the device state: the prestart runner locks a device across
//     processes while it runs steps on it (prestart.Options.LockDir);
//   - the node's ResourceSlices: both publish the same pools; the old
//     instance does not put its stop taint on them while the new one
//     serves (otherInstanceServes).

// SocketFile is the file name of the driver's DRA socket in its plugin
// directory, as the helper names it: dra.sock, or dra-<pod UID>.sock
// during a rolling update.
func SocketFile(uid types.UID) string {
	if uid == "" {
		return "dra.sock"
	}
	return "dra-" + string(uid) + ".sock"
}

// RegistrarSocketFile is the file name of the driver's registration
// socket in registrarDir, as the helper names it: <driver>-reg.sock, or
// one with the pod UID (or its digest) during a rolling update.
func RegistrarSocketFile(registrarDir, driver string, uid types.UID) string {
	if uid == "" {
		return driver + "-reg.sock"
	}
	return kubeletplugin.RollingUpdateRegistrarSocketFile(registrarDir, driver, uid)
}

// serializeLockFile is the lock file of the helper's serialisation of
// calls during a rolling update, in the plugin directory.
const serializeLockFile = "serialize.lock"

// otherInstanceTimeout bounds a connection to another instance's socket.
const otherInstanceTimeout = time.Second

// otherInstanceInfoTimeout bounds another instance's answer to GetInfo
// at stop. The new instance of a rollout may be busy with its own start on
// a loaded node (a 100-node fleet replaced at once on 2 cores answered
// after more than a second); one not found has the old instance taint the
// devices it serves. A socket nobody serves is refused at once.
const otherInstanceInfoTimeout = 5 * time.Second

// otherInstanceServes reports whether another instance of driver is
// registered in registrarDir: a registration socket other than this
// instance's (of pod uid) that answers GetInfo with driver's name.
func otherInstanceServes(registrarDir, driver string, uid types.UID) bool {
	own := kubeletplugin.RollingUpdateRegistrarSocketFile(registrarDir, driver, uid)
	entries, err := os.ReadDir(registrarDir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		name := e.Name()
		if name == own || !strings.HasSuffix(name, "-reg.sock") || e.Type()&os.ModeSocket == 0 {
			continue
		}
		if registeredAs(filepath.Join(registrarDir, name)) == driver {
			return true
		}
	}
	return false
}

// registeredAs is the driver name the registration socket sock answers
// GetInfo with ("" when it does not answer).
func registeredAs(sock string) string {
	ctx, cancel := context.WithTimeout(context.Background(), otherInstanceInfoTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return ""
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return ""
	}
	return info.Name
}

// removeDeadSockets removes, at the start of an instance in a rolling
// update, the sockets of instances of driver that died without removing
// them (a pod killed with no grace): the registration sockets in
// registrarDir named after driver (<driver>-<uid>-reg.sock) and the DRA
// sockets in the driver's own pluginDir (dra-<uid>.sock) on which nobody
// accepts a connection. The kubelet's plugin watcher would go on trying a
// dead instance's registration socket; a live instance's sockets are
// left. It returns the sockets it removed.
func removeDeadSockets(registrarDir, pluginDir, driver string) []string {
	var out []string
	for _, g := range []string{filepath.Join(registrarDir, driver+"-*-reg.sock"), filepath.Join(pluginDir, "dra-*.sock")} {
		matches, _ := filepath.Glob(g)
		for _, p := range matches {
			if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeSocket == 0 || accepts(p) {
				continue
			}
			if err := os.Remove(p); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// accepts reports whether a process accepts connections on the unix
// socket sock.
func accepts(sock string) bool {
	c, err := net.DialTimeout("unix", sock, otherInstanceTimeout)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// rollingLock is the helper's lock file during a rolling update ("": no
// rolling update).
func rollingLock(o Options) string {
	if o.RollingUpdateUID == "" {
		return ""
	}
	return filepath.Join(o.PluginDir, serializeLockFile)
}
