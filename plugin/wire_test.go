package plugin

import (
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// decoded is what the kubelet decodes from the bytes a view sends.
func decoded(t *testing.T, v *view) *pluginapi.ListAndWatchResponse {
	t.Helper()
	out, err := (wireCodec{}).Marshal(v.message())
	if err != nil {
		t.Fatal(err)
	}
	var r pluginapi.ListAndWatchResponse
	if err := proto.Unmarshal(out.Materialize(), &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestListAndWatchBytes: the bytes sent for a view, encoded in full or
// patched after health changes, decode to the view's list; other messages
// go through the proto codec.
func TestListAndWatchBytes(t *testing.T) {
	base := snapshot(30, 2, 3)
	p := newPlugin(t, t.TempDir(), base, nil)
	for _, snap := range []*device.Snapshot{
		base,
		withHealth(base, 0, false, "missing"),
		withHealth(withHealth(base, 0, false, "missing"), 29, false, "missing"),
		withHealth(base, 29, false, "missing"),
		withHealth(base, 15, false, "missing"),
		base,
		snapshot(31, 2, 3),
		withHealth(snapshot(31, 2, 1), 7, false, "missing"),
		snapshot(0, 0, 1),
	} {
		if err := p.Update(snap); err != nil {
			t.Fatal(err)
		}
		v := p.state.Load()
		want := &pluginapi.ListAndWatchResponse{Devices: v.list}
		if got := decoded(t, v); !proto.Equal(got, want) {
			t.Fatalf("sent %v\nwant %v", got, want)
		}
	}
	opts := &pluginapi.DevicePluginOptions{PreStartRequired: true}
	b, err := (wireCodec{}).Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	var back pluginapi.DevicePluginOptions
	if err := (wireCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b.Materialize())}, &back); err != nil || !proto.Equal(&back, opts) {
		t.Fatalf("other messages: %v, %v", &back, err)
	}
	if (wireCodec{}).Name() != encoding.GetCodecV2("proto").Name() {
		t.Fatal("codec name")
	}
}

// TestUpdatePatchesSentBytes: after a health change the bytes of the
// previous view are patched, not encoded again: the unchanged records
// are copied.
func TestUpdatePatchesSentBytes(t *testing.T) {
	healthy := snapshot(2500, 4, 4)
	p := newPlugin(t, t.TempDir(), healthy, nil)
	p.state.Load().message() // sent once, as a stream does
	sick := withHealth(healthy, 3, false, "missing")
	next := sick
	allocs := testing.AllocsPerRun(20, func() {
		if err := p.Update(next); err != nil {
			t.Fatal(err)
		}
		if p.state.Load().wire.Load() == nil {
			t.Fatal("the new view's bytes were not patched from the sent ones")
		}
		p.state.Load().message()
		if next == sick {
			next = healthy
		} else {
			next = sick
		}
	})
	if allocs > 40 {
		t.Errorf("Update and send of one device's health at 10,000 IDs: %.0f allocations, want at most 40", allocs)
	}
}
