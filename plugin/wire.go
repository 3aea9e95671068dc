package plugin

import (
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// wireList is a ListAndWatchResponse already encoded: the records of its
// repeated field 1 (devices), one per list entry, back to back. A health
// change re-encodes the changed entries only and copies the others'
// bytes, so an update of 10,000 IDs does not encode 10,000 messages
// again. Immutable once made (gRPC writes buf after SendMsg returns).
type wireList struct {
	buf []byte
	// ends[k] is where list entry k's record ends in buf.
	ends []int
}

// devicesField is the field number of ListAndWatchResponse.devices.
const devicesField = 1

func appendDevice(b []byte, d *pluginapi.Device) ([]byte, error) {
	b = protowire.AppendTag(b, devicesField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(proto.Size(d)))
	return proto.MarshalOptions{}.MarshalAppend(b, d)
}

// encodeList encodes the response that lists list.
func encodeList(list []*pluginapi.Device) (*wireList, error) {
	w := &wireList{buf: make([]byte, 0, 48*len(list)), ends: make([]int, len(list))}
	for k, d := range list {
		var err error
		if w.buf, err = appendDevice(w.buf, d); err != nil {
			return nil, err
		}
		w.ends[k] = len(w.buf)
	}
	return w, nil
}

// patch encodes list, which differs from the list w encodes in the
// entries changed (ascending) only.
func (w *wireList) patch(list []*pluginapi.Device, changed []int) (*wireList, error) {
	out := &wireList{buf: make([]byte, 0, len(w.buf)+8*len(changed)), ends: make([]int, len(w.ends))}
	from, delta, next := 0, 0, 0 // w.buf copied up to from; ends set below next
	for _, k := range changed {
		start := 0
		if k > 0 {
			start = w.ends[k-1]
		}
		out.buf = append(out.buf, w.buf[from:start]...)
		for ; next < k; next++ {
			out.ends[next] = w.ends[next] + delta
		}
		var err error
		if out.buf, err = appendDevice(out.buf, list[k]); err != nil {
			return nil, err
		}
		out.ends[k], next = len(out.buf), k+1
		delta, from = out.ends[k]-w.ends[k], w.ends[k]
	}
	out.buf = append(out.buf, w.buf[from:]...)
	for ; next < len(w.ends); next++ {
		out.ends[next] = w.ends[next] + delta
	}
	return out, nil
}

// wireCodec is gRPC's proto codec, except that a *wireList is sent as the
// bytes it holds (the server's codec: see serve).
type wireCodec struct{}

var protoCodec = encoding.GetCodecV2(encproto.Name)

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(*wireList); ok {
		return mem.BufferSlice{mem.SliceBuffer(w.buf)}, nil
	}
	return protoCodec.Marshal(v)
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error { return protoCodec.Unmarshal(data, v) }

func (wireCodec) Name() string { return protoCodec.Name() }
