package tables

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// onPause makes fn run at each of Page's pauses for the rest of the test.
func onPause(t *testing.T, fn func()) {
	t.Helper()
	saved := pageYield
	pageYield = fn
	t.Cleanup(func() { pageYield = saved })
}

// pageTable is a table of keys 1..n inserted in order, whose inserted_at
// are distinct: its clock ticks a nanosecond a call.
func pageTable(t *testing.T, n int) *Table {
	t.Helper()
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	var clock atomic.Int64
	tb := mustNew(t, config("t", selectors.KindUniform, selectors.KindFifo, 1<<22, limiter.MinSize(1)), s,
		WithClock(func() time.Time { return time.Unix(0, clock.Add(1)) }))
	for k := range uint64(n) {
		mustInsert(t, tb, newItem(k+1, float64(k%7), 1))
	}
	return tb
}

// linkedKeys reads the table's keys in insertion order from its list, as
// a page of it was taken in one hold of the lock.
func linkedKeys(tb *Table) []uint64 {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var keys []uint64
	for e := tb.head; e != nil; e = tb.linked(e.next) {
		keys = append(keys, e.key)
	}
	return keys
}

func pageKeys(page []ItemView) []uint64 {
	keys := make([]uint64, len(page))
	for i, v := range page {
		keys[i] = v.Key
	}
	return keys
}

// TestPageLetsGoOfTheLock: a page far into a large table lets go of the
// table's lock as it walks, and an insert made while it is let go lands
// without changing the page; the walk starts at the end nearer the
// offset. A page used to hold the lock for the whole walk: at 1,000,000
// items and an offset of 900,000 about 10 ms, during which the table's
// inserts and samples waited.
func TestPageLetsGoOfTheLock(t *testing.T) {
	n := 10*pageStep + 3
	tb := pageTable(t, n)
	pauses, next := 0, uint64(n)
	onPause(t, func() {
		pauses++
		next++
		// Blocks for good where Page holds the lock.
		mustInsert(t, tb, newItem(next, 1, 1))
	})
	for _, c := range []struct {
		offset, pauses int
	}{
		// From the head: 5 steps of skipping, then the item.
		{5 * pageStep, 5},
		// From the tail: 2 steps back rather than 8 forward.
		{n - 1 - 2*pageStep, 2},
		{n - 2, 0},
		{0, 0},
	} {
		pauses = 0
		page, err := tb.Page(c.offset, 1)
		if err != nil || len(page) != 1 || page[0].Key != uint64(c.offset+1) {
			t.Fatalf("Page(%d, 1) = keys %v, %v; want [%d]", c.offset, pageKeys(page), err, c.offset+1)
		}
		if pauses != c.pauses {
			t.Errorf("Page(%d, 1) of %d items let go of the lock %d times, want %d", c.offset, n, pauses, c.pauses)
		}
	}
	if size := tb.Size(); size != int64(next) {
		t.Errorf("size %d after the inserts made while pages walked, want %d", size, next)
	}
}

// TestPageOfAStillTable: on a table nothing changes, every page, from
// every offset and across the steps Page takes, is the list's stretch
// there, as when a page was taken in one hold of the lock.
func TestPageOfAStillTable(t *testing.T) {
	n := 2*pageStep + pageStep/2
	tb := pageTable(t, n)
	// Removed items' slots are reused, so the list is out of slot order.
	for k := uint64(1); k <= uint64(n); k += 3 {
		tb.Delete(k)
	}
	for k := range uint64(n / 3) {
		mustInsert(t, tb, newItem(uint64(n)+k+1, 1, 1))
	}
	all := linkedKeys(tb)
	n = len(all)
	stretch := func(offset, limit int) []uint64 {
		offset = min(max(offset, 0), n)
		return all[offset:min(offset+limit, n)]
	}
	check := func(offset, limit int) {
		t.Helper()
		page, err := tb.Page(offset, limit)
		if err != nil {
			t.Fatalf("Page(%d, %d): %v", offset, limit, err)
		}
		if got, want := pageKeys(page), stretch(offset, limit); !slices.Equal(got, want) {
			t.Fatalf("Page(%d, %d) = %d keys from %v, want %d from %v", offset, limit, len(got), got[:min(len(got), 3)], len(want), want[:min(len(want), 3)])
		}
		for _, v := range page {
			if want := tb.View(v.Key)[0]; v.InsertedAt != want.InsertedAt || v.Priority != want.Priority {
				t.Fatalf("Page(%d, %d): item %d is %+v, want %+v", offset, limit, v.Key, v, want)
			}
		}
	}
	for offset := -1; offset <= n+1; offset++ {
		check(offset, 2)
	}
	for _, offset := range []int{0, 1, pageStep - 1, pageStep, n / 2, n - pageStep - 1, n - 2*pageStep, n - 1} {
		for _, limit := range []int{pageStep, 2*pageStep + 7, n} {
			check(offset, limit)
		}
	}
	if page, err := tb.Page(0, 0); page != nil || err != nil {
		t.Fatalf("Page(0, 0) = %v, %v", pageKeys(page), err)
	}
}

// TestPageWhileTheTableChanges: items inserted, deleted, and deleted and
// inserted again into their slots while pages walk never put a key in a
// page twice nor leave out an item that stayed in the table, and a walk
// whose place is removed starts again, up to a bound. The changes are
// made at Page's pauses, from a fixed seed.
func TestPageWhileTheTableChanges(t *testing.T) {
	n := 3 * pageStep
	tb := pageTable(t, n)
	rng := rand.New(rand.NewPCG(7, 11))
	present := make([]uint64, 0, 2*n)
	for k := range uint64(n) {
		present = append(present, k+1)
	}
	next := uint64(n)
	// touched holds the keys a change reached during the page being taken.
	touched := map[uint64]bool{}
	drop := func(i int) uint64 {
		k := present[i]
		present[i] = present[len(present)-1]
		present = present[:len(present)-1]
		if missing := tb.Delete(k); len(missing) > 0 {
			t.Fatalf("key %d missing", k)
		}
		touched[k] = true
		return k
	}
	insert := func(k uint64) {
		mustInsert(t, tb, newItem(k, 1, 1))
		present = append(present, k)
		touched[k] = true
	}
	onPause(t, func() {
		for range 1 + rng.IntN(200) {
			switch rng.IntN(4) {
			case 0:
				next++
				insert(next)
			case 1:
				if len(present) > 0 {
					drop(rng.IntN(len(present)))
				}
			default:
				// Deleted and inserted again at once: into the slot it
				// left, at the tail.
				if len(present) > 0 {
					insert(drop(rng.IntN(len(present))))
				}
			}
		}
	})
	pages, busy := 0, 0
	for i := range 200 {
		before := linkedKeys(tb)
		clear(touched)
		offset, limit := rng.IntN(len(before)+10), 1+rng.IntN(3*pageStep)
		if i%4 == 0 {
			offset, limit = rng.IntN(pageStep), len(before)
		}
		page, err := tb.Page(offset, limit)
		if errors.Is(err, ErrBusy) {
			busy++
			continue
		}
		if err != nil {
			t.Fatalf("Page(%d, %d): %v", offset, limit, err)
		}
		pages++
		checkPage(t, fmt.Sprintf("Page(%d, %d) of %d", offset, limit, len(before)), page, limit, before, linkedKeys(tb), touched)
	}
	if pages < 150 {
		t.Errorf("%d pages and %d refused as busy of 200: want most taken", pages, busy)
	}
}

// checkPage checks a page taken while the table went from the keys before
// to those after, changing only the keys touched: each key once, every
// one held at some time, and those held all the while in order and with
// none of them missing between the page's first and last.
func checkPage(t *testing.T, what string, page []ItemView, limit int, before, after []uint64, touched map[uint64]bool) {
	t.Helper()
	if len(page) > limit {
		t.Fatalf("%s: %d items", what, len(page))
	}
	held := map[uint64]bool{}
	for _, k := range before {
		held[k] = true
	}
	seen := map[uint64]bool{}
	var stayed []uint64
	for _, v := range page {
		if seen[v.Key] {
			t.Fatalf("%s: key %d twice", what, v.Key)
		}
		seen[v.Key] = true
		if !held[v.Key] && !touched[v.Key] {
			t.Fatalf("%s: key %d was never in the table", what, v.Key)
		}
		if !touched[v.Key] {
			stayed = append(stayed, v.Key)
		}
	}
	if len(stayed) == 0 {
		return
	}
	var between []uint64
	in := false
	for _, k := range after {
		if k == stayed[0] {
			in = true
		}
		if in && !touched[k] {
			between = append(between, k)
		}
		if k == stayed[len(stayed)-1] {
			break
		}
	}
	if !slices.Equal(between, stayed) {
		t.Fatalf("%s: the items that stayed are %d from %v, want the %d from %v between its first and last", what, len(stayed), stayed[:min(3, len(stayed))], len(between), between[:min(3, len(between))])
	}
}

// TestPageLosesItsPlace: a walk whose place is removed at every pause
// gives up, after a bounded number of walks, with ErrBusy, whether the
// item is replaced by another key or by its own inserted again into its
// slot; one from the tail whose items ahead go, or whose table is reset
// under it, lists what is there when it walks again.
func TestPageLosesItsPlace(t *testing.T) {
	n := 3 * pageStep
	tb := pageTable(t, n)
	for _, sameKeys := range []bool{false, true} {
		walks, next := 0, uint64(2*n)
		onPause(t, func() {
			walks++
			// Every item replaced at the tail, into the slot it left.
			for _, k := range linkedKeys(tb) {
				tb.Delete(k)
				if !sameKeys {
					next++
					k = next
				}
				mustInsert(t, tb, newItem(k, 1, 1))
			}
		})
		_, err := tb.Page(n/2, 1)
		wantErr(t, err, []error{ErrBusy}, `"t"`, "try again")
		if walks != pageTries {
			t.Errorf("same keys %v: gave up after %d walks, want %d", sameKeys, walks, pageTries)
		}
	}

	// A walk from the tail whose items ahead go, all but a few, runs out
	// of items before it has counted to offset: it walks again.
	tb = pageTable(t, n)
	offset, pauses := n/2+1, 0
	onPause(t, func() {
		if pauses++; pauses > 1 {
			return
		}
		keys := linkedKeys(tb)
		tb.Delete(keys[:len(keys)-pageStep-10]...)
		for k := range uint64(n) {
			mustInsert(t, tb, newItem(uint64(10*n)+k, 1, 1))
		}
	})
	page, err := tb.Page(offset, 1)
	if want := linkedKeys(tb)[offset]; err != nil || !slices.Equal(pageKeys(page), []uint64{want}) {
		t.Fatalf("Page(%d, 1) with the items ahead of it removed = %v, %v; want [%d]", offset, pageKeys(page), err, want)
	}

	resets := 0
	onPause(t, func() {
		if resets++; resets == 1 {
			tb.Reset()
			for k := range uint64(10) {
				mustInsert(t, tb, newItem(k+1, 1, 1))
			}
		}
	})
	page, err = tb.Page(3, pageStep+10)
	if err != nil || !slices.Equal(pageKeys(page), []uint64{4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("Page(3, ...) across a reset = %v, %v; want keys 4..10", pageKeys(page), err)
	}
}

// TestPageRacingChanges: pages taken while other goroutines insert,
// delete and sample hold each key once, and fail only with ErrBusy. Run
// with -race.
func TestPageRacingChanges(t *testing.T) {
	n := 3 * pageStep
	tb := pageTable(t, n)
	pages := 200
	if testing.Short() {
		pages = 50
	}
	var writers sync.WaitGroup
	defer writers.Wait()
	stop := make(chan struct{})
	defer close(stop)
	for w := range 2 {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := uint64(1 + rng.IntN(2*n))
				switch rng.IntN(3) {
				case 0:
					tb.Delete(k)
				case 1:
					if err := tb.Insert(expired(), newItem(k, 1, 1)); err != nil {
						t.Errorf("insert %d: %v", k, err)
						return
					}
				default:
					if _, err := tb.Sample(expired(), 4); err != nil && !errors.Is(err, limiter.ErrRateLimited) {
						t.Errorf("sample: %v", err)
						return
					}
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(5, 8))
	for range pages {
		offset, limit := rng.IntN(n), 1+rng.IntN(2*n)
		page, err := tb.Page(offset, limit)
		if err != nil && !errors.Is(err, ErrBusy) {
			t.Fatalf("Page(%d, %d): %v", offset, limit, err)
		}
		seen := map[uint64]bool{}
		for _, v := range page {
			if seen[v.Key] {
				t.Fatalf("Page(%d, %d): key %d twice", offset, limit, v.Key)
			}
			seen[v.Key] = true
		}
	}
}
