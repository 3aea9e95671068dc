package plugin

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// MaxListMessage is the largest ListAndWatch answer the kubelet reads: it
// dials device plugins with gRPC's default receive limit of 4 MiB
// (devicemanager/plugin/v1beta1/client.go in kubelet v1.36.3 sets none).
// A larger answer never reaches it: the plugin is registered and the
// kubelet knows none of its devices.
const MaxListMessage = 4 << 20

// ErrListTooLarge is returned by CheckListSize for a resource whose device
// list the kubelet could not read.
var ErrListTooLarge = errors.New("device list larger than the kubelet reads")

// ListSize is the encoded size of a ListAndWatch answer that lists n
// devices, each with an ID of idLen bytes, Unhealthy (the longer of the
// two health values) and on NUMA node numa (device.NoNUMA: no topology).
// Every entry is encoded alone, so a list of IDs up to idLen long and
// nodes up to numa is at most this long.
func ListSize(n, idLen, numa int) int {
	d := &pluginapi.Device{ID: strings.Repeat("x", idLen), Health: pluginapi.Unhealthy}
	if numa != device.NoNUMA {
		d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(numa)}}}
	}
	return n * proto.Size(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{d}})
}

// CheckListSize refuses a resource whose largest device list (n IDs, the
// longest idLen bytes, NUMA nodes up to numa) the kubelet could not read.
func CheckListSize(resource string, n, idLen, numa int) error {
	if size := ListSize(n, idLen, numa); size > MaxListMessage {
		return fmt.Errorf("%w: %s can list %d device IDs, a ListAndWatch answer of up to %d bytes, over the %d bytes the kubelet reads (gRPC's default message limit); lower count or replicas, or split the devices over several resources",
			ErrListTooLarge, resource, n, size, MaxListMessage)
	}
	return nil
}

// messageSize is the encoded size of what ListAndWatch sends for v.
func messageSize(m any) int {
	switch m := m.(type) {
	case *wireList:
		return len(m.buf)
	case proto.Message:
		return proto.Size(m)
	}
	return 0
}
