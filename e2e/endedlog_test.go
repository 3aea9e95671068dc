//go:build e2e

package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// fakeAPI serves the pod list and the logs that endedLog reads: the n-th
// list answers statuses[n] (the last one from then on), and the logs are
// those of the kubelet after that many lists.
type fakeAPI struct {
	statuses []corev1.ContainerStatus
	// current and previous: the log of the current and of the previous
	// container once the API answered lists lists; "" with ok false is
	// the kubelet's 400 (no such container).
	current, previous func(lists int) (string, bool)

	mu    sync.Mutex
	lists int
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/api/v1/namespaces/bad/pods":
		s := f.statuses[min(f.lists, len(f.statuses)-1)]
		f.lists++
		l := corev1.PodList{
			TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
			Items: []corev1.Pod{{
				ObjectMeta: metav1.ObjectMeta{Name: "plugin-x", Namespace: "bad"},
				Status:     corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{s}},
			}},
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&l)
	case "/api/v1/namespaces/bad/pods/plugin-x/log":
		read := f.current
		if r.URL.Query().Get("previous") == "true" {
			read = f.previous
		}
		l, ok := read(f.lists)
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(&metav1.Status{
				TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status:   metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
				Message: "previous terminated container not found",
			})
			return
		}
		_, _ = w.Write([]byte(l))
	default:
		http.NotFound(w, r)
	}
}

// TestEndedLog: scenario 8's read of the log of the plugin container that
// exited with status 2, against an API whose kubelet restarts that
// container (restartPolicy Always) around the reads.
func TestEndedLog(t *testing.T) {
	const msg = `level=fatal msg="invalid configuration" error="resources[0].idPrefix \"../evil\": not a valid name"` + "\n"
	want := []string{"invalid configuration", "idPrefix", "../evil"}
	exited := &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"}
	terminated := func(restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "plugin", RestartCount: restarts, State: corev1.ContainerState{Terminated: exited}}
	}
	running := func(restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "plugin", RestartCount: restarts,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			LastTerminationState: corev1.ContainerState{Terminated: exited}}
	}
	backOff := func(restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "plugin", RestartCount: restarts,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: exited}}
	}
	always := func(l string) func(int) (string, bool) { return func(int) (string, bool) { return l, true } }
	none := func(int) (string, bool) { return "", false }
	for _, tc := range []struct {
		name              string
		statuses          []corev1.ContainerStatus
		current, previous func(int) (string, bool)
	}{
		{
			name:     "not restarted yet: the current container's log",
			statuses: []corev1.ContainerStatus{terminated(0)},
			current:  always(msg), previous: none,
		},
		{
			name:     "in back-off: the previous container's log",
			statuses: []corev1.ContainerStatus{backOff(3)},
			current:  none, previous: always(msg),
		},
		{
			// The kubelet started the next container after the status
			// read: the current log is the new one's, empty; the next
			// status shows the restart.
			name:     "restarted between the status and the log read",
			statuses: []corev1.ContainerStatus{terminated(0), running(1)},
			current:  always(""), previous: always(msg),
		},
		{
			// The API shows the ended container as the current one for
			// a while after the kubelet restarted it.
			name:     "the status lags the kubelet",
			statuses: []corev1.ContainerStatus{terminated(0), terminated(0), terminated(0), backOff(1)},
			current:  always(""), previous: always(msg),
		},
		{
			// The next container has started and logged part of its
			// line only.
			name:     "the next container's log is partial",
			statuses: []corev1.ContainerStatus{terminated(0), terminated(0), running(1)},
			current:  always("level=info msg=starting\n"), previous: always(msg),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &fakeAPI{statuses: tc.statuses, current: tc.current, previous: tc.previous}
			srv := httptest.NewServer(api)
			defer srv.Close()
			cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			c := &cluster{cs: cs}
			got := c.endedLog(t, "bad", 2, want, 10*time.Second)
			for _, w := range want {
				if !strings.Contains(got, w) {
					t.Errorf("log %q lacks %q", got, w)
				}
			}
		})
	}
}
