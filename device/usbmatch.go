package device

import (
	"slices"
	"strconv"
	"strings"
)

// matchUSB gives the USB devices found now (those with a port, Identity.
// USBPort) the registry keys of the known devices they are, and the others
// keys of their own; s.mu is held. What the discovery keyed a device by
// (Found.Key) says what the devices there now tell; only the source knows
// the devices remembered, and so decides. It applies, in this order:
//
//   - the port or the serial (byPortOrSerial, takeUnambiguous): a found
//     device is a known one when both have the same vendor, product and
//     serial, and either it is at the port where the known one was last
//     found, or its serial identifies it;
//   - a registry of an earlier version (takeLegacy): a known device with no
//     port recorded is taken by the one device with its identity left;
//   - a key of its own for every found device left (keyOwn).
//
// Where two found devices could be one known device, neither is: a new ID
// is safer than another device's.
func (s *Source) matchUSB(cands map[string]candidate, keys []string) (map[string]candidate, []string) {
	m := usbMatcher{s: s, prefix: s.opts.DiscoverKind + "/", cands: cands}
	for _, k := range keys {
		if cands[k].identity.USBPort != "" {
			m.usb = append(m.usb, k)
		}
	}
	if len(m.usb) == 0 {
		return cands, keys
	}
	m.remember()
	m.byPortOrSerial()
	m.takeUnambiguous()
	m.takeLegacy()
	m.keyOwn(keys)
	return m.rekeyed(keys)
}

// usbMatcher is the state of one matchUSB: what each rule finds, for the
// rules after it.
type usbMatcher struct {
	s *Source
	// prefix starts every registry key of the source's discovery.
	prefix string
	cands  map[string]candidate
	// usb are the discovery keys of the found USB devices, in order.
	usb []string
	// remembered are the known USB devices by USBSerialKey.
	remembered map[string][]usbEntry
	// could is, by found device, the known ones it could be; claims, by
	// known device, how many found ones could be it.
	could  map[string][]string
	claims map[string]int
	// rekey is, by found device, the registry key it gets; taken, the
	// known devices a found one was matched with.
	rekey map[string]string
	taken map[string]bool
}

// usbEntry is a known USB device as matchUSB weighs it.
type usbEntry struct {
	key, port string
	waiting   bool // rebuilt from the spec: adopt decides
}

// lastPort is where the known device under k was last found: its recorded
// port, or the one its key names (earlier versions).
func (m *usbMatcher) lastPort(k string, d Device) string {
	if d.Identity.USBPort != "" {
		return d.Identity.USBPort
	}
	if p, ok := strings.CutPrefix(k, m.prefix+usbPortPrefix); ok {
		return p
	}
	return ""
}

// remember groups the known USB devices of the discovery by vendor,
// product and serial.
func (m *usbMatcher) remember() {
	m.remembered = map[string][]usbEntry{}
	for k, d := range m.s.known {
		if !strings.HasPrefix(k, m.prefix) || d.Identity.USBVendor == "" {
			continue
		}
		id := USBSerialKey(d.Identity)
		m.remembered[id] = append(m.remembered[id], usbEntry{key: k, port: m.lastPort(k, d), waiting: strings.HasPrefix(k, m.prefix+recoveredKey)})
	}
}

// byPortOrSerial lists the known devices each found one could be: those
// with its vendor, product and serial, that are not waiting for adopt,
// and either were last found at its port or are identified by its serial
// (identifiedBySerial).
func (m *usbMatcher) byPortOrSerial() {
	present := map[string]int{}
	for _, k := range m.usb {
		present[USBSerialKey(m.cands[k].identity)]++
	}
	m.could, m.claims = map[string][]string{}, map[string]int{}
	for _, k := range m.usb {
		c := m.cands[k]
		id := USBSerialKey(c.identity)
		es := m.remembered[id]
		bySerial := m.identifiedBySerial(k, c, present[id], len(es))
		for _, e := range es {
			if !e.waiting && ((e.port != "" && e.port == c.identity.USBPort) || bySerial) {
				m.could[k] = append(m.could[k], e.key)
				m.claims[e.key]++
			}
		}
	}
}

// identifiedBySerial reports whether the serial of the found device c
// (discovery key k) identifies it: the discovery keyed it by its serial
// (no other device there has it), present devices found have its
// identity and remembered devices are known with it, one each. So once
// two adapters with one serial were seen, the serial alone decides
// nothing while both are remembered, after a restart too: each is its
// port's.
func (m *usbMatcher) identifiedBySerial(k string, c candidate, present, remembered int) bool {
	return c.identity.USBSerial != "" && k == m.prefix+USBSerialKey(c.identity) && present == 1 && remembered == 1
}

// takeUnambiguous matches each found device with the known one it could
// be, unless another found device could be it too. Of several known
// devices at its port with its identity, which only a registry edited by
// hand has, it is the newest.
func (m *usbMatcher) takeUnambiguous() {
	m.rekey, m.taken = map[string]string{}, map[string]bool{}
	for _, k := range m.usb {
		es := m.could[k]
		if len(es) == 0 {
			continue
		}
		e := slices.MaxFunc(es, func(a, b string) int { return m.s.known[a].Index - m.s.known[b].Index })
		if m.claims[e] == 1 {
			m.rekey[k], m.taken[e] = e, true
		}
	}
}

// takeLegacy matches a known device of a registry of an earlier version
// (no port recorded), the only one of its identity not taken, with the one
// found device of that identity that could be no known device.
func (m *usbMatcher) takeLegacy() {
	for id, es := range m.remembered {
		legacy := m.untakenLegacy(es)
		if len(legacy) != 1 {
			continue
		}
		if left := m.unmatched(id); len(left) == 1 {
			m.rekey[left[0]], m.taken[legacy[0]] = legacy[0], true
		}
	}
}

// untakenLegacy are the known devices of es with no port recorded that
// are neither waiting for adopt nor taken.
func (m *usbMatcher) untakenLegacy(es []usbEntry) []string {
	var out []string
	for _, e := range es {
		if e.port == "" && !e.waiting && !m.taken[e.key] {
			out = append(out, e.key)
		}
	}
	return out
}

// unmatched are the found devices with identity id (USBSerialKey) that
// could be no known device.
func (m *usbMatcher) unmatched(id string) []string {
	var out []string
	for _, k := range m.usb {
		if USBSerialKey(m.cands[k].identity) == id && len(m.could[k]) == 0 {
			out = append(out, k)
		}
	}
	return out
}

// keyOwn keys each found device that is no known one: by its discovery key
// when keepsKey says so, else by its port, made unique.
func (m *usbMatcher) keyOwn(keys []string) {
	used := map[string]bool{}
	for _, k := range keys {
		if m.cands[k].identity.USBPort == "" {
			used[k] = true
		}
	}
	for _, nk := range m.rekey {
		used[nk] = true
	}
	for _, k := range m.usb {
		if _, ok := m.rekey[k]; ok {
			continue
		}
		if !used[k] && m.keepsKey(k) {
			m.rekey[k] = k
		} else {
			m.rekey[k] = m.portKey(m.cands[k].identity.USBPort, used)
		}
		used[m.rekey[k]] = true
	}
}

// keepsKey reports whether the found device under discovery key k, no
// known device, may keep that key: no known device has it, or the known
// one has no identity recorded, or it was last found at this port with
// another identity, which it then finds changed (identity_changed, as for
// PCI).
func (m *usbMatcher) keepsKey(k string) bool {
	c := m.cands[k]
	d, known := m.s.known[k]
	return !known || d.Identity.recorded() == (recordedIdentity{}) ||
		(identityChange(d.Identity, c.identity) != "" && m.lastPort(k, d) == c.identity.USBPort)
}

// portKey is the key of port that no known device has and none is used:
// USBPortKey, else with "~2", "~3"... appended.
func (m *usbMatcher) portKey(port string, used map[string]bool) string {
	base := m.prefix + USBPortKey(port)
	k := base
	for n := 2; ; n++ {
		if _, known := m.s.known[k]; !known && !used[k] {
			return k
		}
		k = base + "~" + strconv.Itoa(n)
	}
}

// rekeyed returns the candidates under their registry keys, in the order
// of keys.
func (m *usbMatcher) rekeyed(keys []string) (map[string]candidate, []string) {
	out := make(map[string]candidate, len(m.cands))
	order := make([]string, 0, len(keys))
	for _, k := range keys {
		c := m.cands[k]
		if nk, ok := m.rekey[k]; ok {
			k, c.key = nk, nk
		}
		out[k] = c
		order = append(order, k)
	}
	return out, order
}
