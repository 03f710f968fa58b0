package tables

import (
	"fmt"
	"slices"
)

// versionIndex follows the policy versions of a table's items: how many
// items each version has (for Info), and, while the table bounds
// staleness, which keys hold each version, oldest version first, so that
// the stale ones are found without a scan. Key lists are cleaned lazily:
// they may name items removed since, or re-inserted with another version,
// and are compacted once they are mostly such.
type versionIndex struct {
	count map[int64]int64
	keys  map[int64][]uint64 // nil without a staleness bound
	order []int64            // the versions in keys, ascending
}

func newVersionIndex(bounded bool) versionIndex {
	v := versionIndex{count: make(map[int64]int64)}
	if bounded {
		v.keys = make(map[int64][]uint64)
	}
	return v
}

func (v *versionIndex) add(key uint64, version int64) {
	v.count[version]++
	if v.keys == nil {
		return
	}
	ks, ok := v.keys[version]
	if !ok {
		i, _ := slices.BinarySearch(v.order, version)
		v.order = slices.Insert(v.order, i, version)
	}
	v.keys[version] = append(ks, key)
}

func (v *versionIndex) remove(version int64) {
	if v.count[version]--; v.count[version] <= 0 {
		delete(v.count, version)
	}
}

// compact drops the keys of version that no longer name an item of it,
// once they outnumber the live ones.
func (v *versionIndex) compact(version int64, live func(key uint64, version int64) bool) {
	ks := v.keys[version]
	if int64(len(ks)) <= 2*v.count[version]+16 {
		return
	}
	kept := ks[:0]
	for _, k := range ks {
		if live(k, version) {
			kept = append(kept, k)
		}
	}
	v.keys[version] = kept
}

// span is the lowest and highest version of the items; ok is false for an
// empty table.
func (v *versionIndex) span() (lo, hi int64, ok bool) {
	for version := range v.count {
		if !ok || version < lo {
			lo = version
		}
		if !ok || version > hi {
			hi = version
		}
		ok = true
	}
	return lo, hi, ok
}

// StaleBefore is the lowest policy version the table keeps now, and false
// when it bounds no staleness.
func (t *Table) StaleBefore() (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.staleBefore()
}

// staleBefore is StaleBefore with the table's lock held.
func (t *Table) staleBefore() (int64, bool) {
	if t.cfg.MaxStaleness == nil {
		return 0, false
	}
	return t.version - *t.cfg.MaxStaleness, true
}

// SetPolicyVersion raises the table's current policy version to version
// (a lower or equal one changes nothing: the highest set wins, whoever
// sets it) and, with MaxStaleness, removes the items it makes stale. It
// reports whether the version rose.
func (t *Table) SetPolicyVersion(version int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if version <= t.version {
		return false
	}
	t.version = version
	t.evictStaleLocked()
	return true
}

// ReconfigureStaleness replaces the table's staleness bound (nil: none)
// while it runs, removing the items a tighter bound makes stale.
func (t *Table) ReconfigureStaleness(maxStaleness *int64) error {
	if maxStaleness != nil && *maxStaleness < 0 {
		return fmt.Errorf("%w: table %q: max_staleness must be >= 0, got %d", ErrInvalidConfig, t.name, *maxStaleness)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if maxStaleness == nil {
		t.cfg.MaxStaleness = nil
	} else {
		k := *maxStaleness
		t.cfg.MaxStaleness = &k
	}
	t.rebuildVersionsLocked()
	t.evictStaleLocked()
	return nil
}

// rebuildVersionsLocked indexes the items' versions anew, with key lists
// when the table bounds staleness.
func (t *Table) rebuildVersionsLocked() {
	t.versions = newVersionIndex(t.cfg.MaxStaleness != nil)
	for e := t.head; e != nil; e = t.linked(e.next) {
		t.versions.add(e.key, e.version)
	}
}

// evictStaleLocked removes the items below the staleness bound.
func (t *Table) evictStaleLocked() {
	floor, ok := t.staleBefore()
	if !ok {
		return
	}
	v := &t.versions
	for len(v.order) > 0 && v.order[0] < floor {
		version := v.order[0]
		for _, key := range v.keys[version] {
			if e, ok := t.lookup(key); ok && e.version == version {
				t.removeLocked(e)
				t.counters.StaleEvictions++
			}
		}
		delete(v.keys, version)
		v.order = v.order[1:]
	}
}

// CountStaleEviction counts an item that went stale before it was in the
// table (while a caller held it back), as the table counts its own.
func (t *Table) CountStaleEviction() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counters.StaleEvictions++
}
