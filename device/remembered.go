package device

// remembered makes the finder of host devices (Source.disc: globs,
// identified) a discoverer: what it finds is matched with the devices the
// registry remembers (scanHost), so IDs and indexes stay stable and a
// vanished device stays, Unhealthy, until it is forgotten.
type remembered struct{}

func (remembered) prepare(s *Source) error { return s.loadRegistry() }

func (remembered) scan(s *Source, snap *Snapshot) *Snapshot { return s.scanHost(snap) }

func (remembered) watchDirs(s *Source) []string { return s.disc.watchDirs(s) }
