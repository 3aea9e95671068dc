package plugin

import (
	"strconv"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// SetAliases sets the device IDs of an earlier version that the kubelet
// still holds (old name -> current device name, from cdi.LegacyAliases).
// They are never advertised nor allocated; PreStartContainer, which the
// kubelet calls with the IDs it checkpointed, takes them for the device
// they name. nil drops them.
func (p *Plugin) SetAliases(aliases map[string]string) {
	if len(aliases) == 0 {
		p.aliases.Store(nil)
		return
	}
	p.aliases.Store(&aliases)
}

// current returns ids with every ID unknown to v that is an alias (or a
// replica of one, "<old>::<r>") replaced by the current ID it stands for;
// ids itself when there is nothing to replace.
func (p *Plugin) current(v *view, ids []string) []string {
	ap := p.aliases.Load()
	if ap == nil {
		return ids
	}
	aliases := *ap
	var out []string
	for k, id := range ids {
		if _, ok := v.ids[id]; ok {
			continue
		}
		cur, ok := "", false
		if name, found := aliases[id]; found && v.snap.Replicas <= 1 {
			cur, ok = name, true
		} else if i := strings.LastIndex(id, "::"); i >= 0 && v.snap.Replicas > 1 {
			if n, err := strconv.Atoi(id[i+2:]); err == nil && aliases[id[:i]] != "" {
				cur, ok = device.ReplicaID(aliases[id[:i]], n, v.snap.Replicas), true
			}
		}
		if !ok {
			continue
		}
		if out == nil {
			out = append([]string(nil), ids...)
		}
		out[k] = cur
	}
	if out == nil {
		return ids
	}
	return out
}
