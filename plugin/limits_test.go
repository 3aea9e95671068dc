package plugin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestListSize: ListSize is the size of the real encoding, by protobuf and
// by the pre-encoded list ListAndWatch sends, for lists of IDs up to the
// given length, healthy or not, with or without topology.
func TestListSize(t *testing.T) {
	for _, c := range []struct{ n, idLen, numa int }{
		{1, 5, device.NoNUMA}, {3, 20, 0}, {200, 130, 7}, {1000, 13, 1 << 20},
	} {
		t.Run(strconv.Itoa(c.n)+"x"+strconv.Itoa(c.idLen), func(t *testing.T) {
			list := make([]*pluginapi.Device, c.n)
			for i := range list {
				d := &pluginapi.Device{ID: strings.Repeat("i", c.idLen), Health: pluginapi.Unhealthy}
				if c.numa != device.NoNUMA {
					d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(c.numa)}}}
				}
				list[i] = d
			}
			want := proto.Size(&pluginapi.ListAndWatchResponse{Devices: list})
			if got := ListSize(c.n, c.idLen, c.numa); got != want {
				t.Fatalf("ListSize %d, encoded %d", got, want)
			}
			w, err := encodeList(list)
			if err != nil {
				t.Fatal(err)
			}
			if messageSize(w) != want {
				t.Fatalf("pre-encoded %d bytes, protobuf %d", messageSize(w), want)
			}
			// Shorter IDs, healthy, lower nodes: never larger.
			list[0].ID, list[0].Health = "x", pluginapi.Healthy
			if got := proto.Size(&pluginapi.ListAndWatchResponse{Devices: list}); got > want {
				t.Fatalf("a smaller list encodes to %d > %d", got, want)
			}
		})
	}
}

// TestCheckListSize: count 4096 with 64 replicas lists
// 262,144 IDs, which the kubelet cannot read: refused, naming the
// resource, the IDs and the limit; the largest list under the limit is
// accepted.
func TestCheckListSize(t *testing.T) {
	err := CheckListSize("example.com/big", 4096*64, len("sim-4095::63"), device.NoNUMA)
	if !errors.Is(err, ErrListTooLarge) {
		t.Fatalf("got %v, want ErrListTooLarge", err)
	}
	for _, want := range []string{"example.com/big", "262144 device IDs", strconv.Itoa(MaxListMessage)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %q", err, want)
		}
	}
	per := ListSize(1, 12, 3)
	fit := MaxListMessage / per
	if err := CheckListSize("example.com/fit", fit, 12, 3); err != nil {
		t.Fatalf("%d IDs of %d bytes each: %v", fit, per, err)
	}
	if err := CheckListSize("example.com/fit", fit+1, 12, 3); !errors.Is(err, ErrListTooLarge) {
		t.Fatalf("%d IDs: %v", fit+1, err)
	}
}

// TestListAndWatchLogsAnUnreadableList: a device list
// larger than the kubelet reads (host devices can outgrow the limit at run
// time) is logged as an error with its size; the kubelet stand-in, with
// the kubelet's default receive limit, gets no list.
func TestListAndWatchLogsAnUnreadableList(t *testing.T) {
	dir := testutil.ShortDir(t)
	log, hook := logtest.NewNullLogger()
	n := MaxListMessage / ListSize(1, 100, device.NoNUMA) * 11 / 10 // healthy entries are shorter
	snap := &device.Snapshot{Replicas: 1}
	for i := range n {
		name := fmt.Sprintf("%0100d", i)
		snap.Devices = append(snap.Devices, device.Device{Name: name, Index: i, HostPath: "/dev/null", ContainerPath: "/dev/x",
			Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA, Healthy: true})
	}
	p := newPlugin(t, dir, snap, func(o *Options) { o.Log = logrus.NewEntry(log) })
	k := startKubelet(t, dir)
	runPlugin(t, p)
	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, updates := testutil.Watch(context.Background(), t, dir, reg.Request.Endpoint)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var found *logrus.Entry
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.ErrorLevel && strings.Contains(e.Message, "larger than the kubelet reads") {
				found = e
			}
		}
		if found != nil {
			if found.Data["devices"] != n || found.Data["bytes"].(int) <= MaxListMessage {
				t.Fatalf("logged %v", found.Data)
			}
			break
		}
		if time.Now().After(deadline) {
			for _, e := range hook.AllEntries() {
				t.Log(e.Level, e.Message, e.Data)
			}
			t.Fatal("no error logged for a list the kubelet cannot read")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case u, ok := <-updates:
		if ok {
			t.Fatalf("the stand-in read a list of %d devices over the limit", len(u.Devices))
		}
	case <-time.After(time.Second):
	}
}
