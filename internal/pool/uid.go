package pool

import (
	"math/bits"
	"sync"
)

// uidSet hands out the ids of a root server's children from the block
// every zygote maps (sandbox.ChildIDCount ids from sandbox.ChildIDBase),
// so that no two live children are ever the same user. A counter taken
// modulo the block did that only while no child outlived 65 536 later
// spawns: a session lives for hours, a busy server spawns that many in
// minutes, and two runs that are one user to the kernel share its
// per-user counts (RLIMIT_NPROC's among them). Ids go round in turn, so
// a freed one is the last to be used again.
type uidSet struct {
	mu   sync.Mutex
	used []uint64 // a bit per id
	next int      // where the search for a free id starts
	n    int      // ids in use
}

// newUIDSet makes a set of size ids, a multiple of 64.
func newUIDSet(size int) *uidSet {
	if size <= 0 || size%64 != 0 {
		panic("pool: uid set size must be a positive multiple of 64")
	}
	return &uidSet{used: make([]uint64, size/64)}
}

// take returns a free id, from 0, and false when every one is in use.
func (s *uidSet) take() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	size := len(s.used) * 64
	if s.n == size {
		return 0, false
	}
	i := s.next
	for {
		w := s.used[i/64] >> (i % 64)
		if w != ^uint64(0)>>(i%64) {
			// A free bit in this word at or after i.
			i += bits.TrailingZeros64(^w)
			break
		}
		i = (i/64 + 1) * 64 % size
	}
	s.used[i/64] |= 1 << (i % 64)
	s.n++
	s.next = (i + 1) % size
	return i, true
}

// put frees an id take returned.
func (s *uidSet) put(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used[i/64]&(1<<(i%64)) != 0 {
		s.used[i/64] &^= 1 << (i % 64)
		s.n--
	}
}
