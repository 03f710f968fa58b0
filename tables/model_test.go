package tables

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// model is a deliberately naive table: a slice in insertion order, a Fifo
// remover, and the limiter inequality written out as in Reverb.
type model struct {
	maxSize  int
	maxTimes int32
	lim      limiter.Config
	items    []modelItem
	inserts  int64
	samples  int64
	deletes  int64
	// offset is what the limiter adds to its difference after a change of
	// samples_per_insert, so that the new ratio weighs only later inserts.
	offset   float64
	counters Counters
}

type modelItem struct {
	key      uint64
	priority float64
	times    int32
}

func (m *model) index(key uint64) int {
	return slices.IndexFunc(m.items, func(it modelItem) bool { return it.key == key })
}

func (m *model) canInsert() bool {
	if m.inserts+1-m.deletes <= m.lim.MinSize {
		return true
	}
	return float64(m.inserts+1)*m.lim.SamplesPerInsert-float64(m.samples)+m.offset <= m.lim.MaxDiff
}

func (m *model) canSample() bool {
	return m.inserts-m.deletes >= m.lim.MinSize &&
		float64(m.inserts)*m.lim.SamplesPerInsert-float64(m.samples)+m.offset-1 >= m.lim.MinDiff
}

func (m *model) remove(i int) {
	m.items = slices.Delete(m.items, i, i+1)
	m.deletes++
	m.counters.Deletes++
	if len(m.items) == 0 {
		// The model's chunks carry no episode (0): its one episode is gone
		// when its last item is.
		m.counters.DeletedEpisodes++
	}
}

func (m *model) keys() []uint64 {
	var keys []uint64
	for _, it := range m.items {
		keys = append(keys, it.key)
	}
	return keys
}

// modelLimiters are the limiter configs the model test switches between.
var modelLimiters = func() []limiter.Config {
	ratio, err := limiter.SampleToInsertRatio(2, 3, 4)
	if err != nil {
		panic(err)
	}
	return []limiter.Config{limiter.MinSize(1), limiter.MinSize(4), limiter.Queue(5), ratio}
}()

// runModel applies ops random operations to a real table and to the model
// and compares them after each one. With a Uniform sampler the model cannot
// predict the key drawn, so it checks the key is one it holds and follows it.
func runModel(t *testing.T, sampler selectors.Kind, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	store := NewChunkStore()
	for k := range ChunkKey(5) {
		putChunk(store, k, 1, 10*int(k)+1)
	}
	m := &model{maxSize: 6, maxTimes: 2, lim: modelLimiters[0]}
	cfg := config("m", sampler, selectors.KindFifo, int64(m.maxSize), m.lim)
	cfg.MaxTimesSampled = m.maxTimes
	tb := mustNew(t, cfg, store, WithRand(rand.New(rand.NewPCG(seed, 7))))
	for step := range ops {
		var what string
		switch r := rng.IntN(100); {
		case r < 40:
			key, prio := uint64(rng.IntN(12)), float64(rng.IntN(4))
			what = fmt.Sprintf("insert %d", key)
			err := tb.Insert(expired(), newItem(key, prio, ChunkKey(rng.IntN(5)), ChunkKey(rng.IntN(5))))
			switch i := m.index(key); {
			case i >= 0:
				m.items[i].priority = prio
			case m.canInsert():
				m.items = append(m.items, modelItem{key: key, priority: prio})
				m.inserts++
				m.counters.Inserts++
				for len(m.items) > m.maxSize {
					m.remove(0)
					m.counters.Evictions++
				}
			default:
				if !errors.Is(err, limiter.ErrRateLimited) {
					t.Fatalf("step %d (%s): got %v, want rate limited", step, what, err)
				}
				m.counters.InsertWaits++
				err = nil
			}
			if err != nil {
				t.Fatalf("step %d (%s): %v", step, what, err)
			}
		case r < 75:
			n := 1 + rng.IntN(3)
			what = fmt.Sprintf("sample %d", n)
			ss, err := tb.Sample(expired(), n)
			var i int
			for i = 0; i < n && m.canSample(); i++ {
				if i >= len(ss) {
					t.Fatalf("step %d (%s): got %d samples, model allows more", step, what, len(ss))
				}
				j := 0
				if sampler == selectors.KindUniform {
					if j = m.index(ss[i].Info.Key); j < 0 {
						t.Fatalf("step %d (%s): sampled key %d the model does not hold", step, what, ss[i].Info.Key)
					}
				}
				it := &m.items[j]
				if it.times == 0 {
					m.counters.UniqueSamples++
				}
				it.times++
				want := SampleInfo{Key: it.key, Priority: it.priority, TimesSampled: it.times, TableSize: int64(len(m.items))}
				got := ss[i].Info
				if got.Key != want.Key || got.Priority != want.Priority || got.TimesSampled != want.TimesSampled || got.TableSize != want.TableSize {
					t.Fatalf("step %d (%s): sample %d is %+v, want %+v", step, what, i, got, want)
				}
				m.samples++
				m.counters.Samples++
				if m.maxTimes > 0 && it.times >= m.maxTimes {
					m.remove(j)
				}
			}
			if len(ss) != i {
				t.Fatalf("step %d (%s): got %d samples, model allows %d", step, what, len(ss), i)
			}
			if i < n {
				if !errors.Is(err, limiter.ErrRateLimited) {
					t.Fatalf("step %d (%s): got %v, want rate limited", step, what, err)
				}
				m.counters.SampleWaits++
			} else if err != nil {
				t.Fatalf("step %d (%s): %v", step, what, err)
			}
		case r < 85:
			key := uint64(rng.IntN(12))
			what = fmt.Sprintf("delete %d", key)
			missing := tb.Delete(key)
			if i := m.index(key); i >= 0 {
				m.remove(i)
				if missing != nil {
					t.Fatalf("step %d (%s): reported missing", step, what)
				}
			} else if !slices.Equal(missing, []uint64{key}) {
				t.Fatalf("step %d (%s): missing %v", step, what, missing)
			}
		case r < 95:
			key, prio := uint64(rng.IntN(12)), float64(rng.IntN(4))
			what = fmt.Sprintf("update %d", key)
			missing, err := tb.Mutate([]Mutation{{Key: key, Priority: prio}})
			if err != nil {
				t.Fatal(err)
			}
			if i := m.index(key); i >= 0 {
				m.items[i].priority = prio
			} else if !slices.Equal(missing, []uint64{key}) {
				t.Fatalf("step %d (%s): missing %v", step, what, missing)
			}
		case r < 97:
			what = "reset"
			tb.Reset()
			m.items = nil
			m.inserts, m.samples, m.deletes, m.offset = 0, 0, 0, 0
		default:
			old := m.lim
			m.lim = modelLimiters[rng.IntN(len(modelLimiters))]
			m.offset += float64(m.inserts) * (old.SamplesPerInsert - m.lim.SamplesPerInsert)
			m.maxTimes = int32(rng.IntN(6)) - 2 // below 1: unlimited
			what = fmt.Sprintf("reconfigure %+v max times %d", m.lim, m.maxTimes)
			if err := tb.Reconfigure(m.lim, m.maxTimes); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := listKeys(t, tb), m.keys(); !slices.Equal(got, want) {
			t.Fatalf("step %d (%s): keys %v, model %v", step, what, got, want)
		}
		info := tb.Info()
		if want := (limiter.State{Config: m.lim, Inserts: m.inserts, Samples: m.samples, Deletes: m.deletes, Offset: m.offset}); info.Limiter != want {
			t.Fatalf("step %d (%s): limiter %+v, model %+v", step, what, info.Limiter, want)
		}
		if info.Counters != m.counters {
			t.Fatalf("step %d (%s): counters %+v, model %+v", step, what, info.Counters, m.counters)
		}
		for _, it := range m.items {
			if got := tb.Get(it.key); len(got) != 1 || got[0].Priority != it.priority || got[0].TimesSampled != it.times {
				t.Fatalf("step %d (%s): item %+v, model %+v", step, what, got, it)
			}
		}
		checkRefs(t, store, 1, tb)
	}
}

func TestModel(t *testing.T) {
	ops := 3000
	if testing.Short() {
		ops = 500
	}
	for _, sampler := range []selectors.Kind{selectors.KindFifo, selectors.KindUniform} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%s/seed=%d", sampler, seed), func(t *testing.T) {
				runModel(t, sampler, seed, ops)
			})
		}
	}
}
