package bench

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

func TestPct(t *testing.T) {
	ten := durations(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for _, tc := range []struct {
		sorted []time.Duration
		p      int
		want   time.Duration
	}{
		{ten, 50, 5 * time.Millisecond},
		{ten, 99, 10 * time.Millisecond},
		{ten, 100, 10 * time.Millisecond},
		{ten, 0, 1 * time.Millisecond},
		{ten, 1, 1 * time.Millisecond},
		{ten, 11, 2 * time.Millisecond},
		{durations(7), 50, 7 * time.Millisecond},
		{durations(7), 99, 7 * time.Millisecond},
		{durations(1, 2), 50, 1 * time.Millisecond},
		{durations(1, 2), 51, 2 * time.Millisecond},
		{durations(1, 2, 3), 50, 2 * time.Millisecond},
	} {
		mustEqual(t, "pct", pct(tc.sorted, tc.p), tc.want)
	}
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		a, b time.Duration
		want float64
	}{
		{10, 5, 2},
		{5, 10, 0.5},
		{0, 10, 0},
		{10, 0, 0},
		{10, -1, 0},
	} {
		mustEqual(t, "ratio", ratio(tc.a, tc.b), tc.want)
	}
}

func TestFormatMilliseconds(t *testing.T) {
	for _, tc := range []struct {
		d       time.Duration
		ms, msd string
	}{
		{0, "0.0ms", "0.00ms"},
		{1234567 * time.Nanosecond, "1.2ms", "1.23ms"},
		{1239 * time.Microsecond, "1.2ms", "1.24ms"},
		{999 * time.Nanosecond, "0.0ms", "0.00ms"}, // below a microsecond
		{43400 * time.Microsecond, "43.4ms", "43.40ms"},
		{-620 * time.Microsecond, "-0.6ms", "-0.62ms"},
	} {
		mustEqual(t, "ms", ms(tc.d), tc.ms)
		mustEqual(t, "msd", msd(tc.d), tc.msd)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		v    []int64
		want int64
	}{
		{[]int64{3, 1, 2}, 2},
		{[]int64{4, 1, 3, 2}, 3},
		{[]int64{5}, 5},
	} {
		mustEqual(t, "median", median(tc.v), tc.want)
	}
}

// TestMeasureBetween: one untimed warm-up, then n timed calls each after
// between, sorted; an error from either stops it.
func TestMeasureBetween(t *testing.T) {
	var calls, betweens int
	sleeps := []time.Duration{0, 3 * time.Millisecond, 1 * time.Millisecond, 2 * time.Millisecond}
	d, err := measureBetween(3, func() error { betweens++; return nil }, func() error {
		time.Sleep(sleeps[calls])
		calls++
		return nil
	})
	if err != nil || calls != 4 || betweens != 3 || len(d) != 3 || !slices.IsSorted(d) || d[0] < time.Millisecond {
		t.Errorf("calls %d, betweens %d, %v %v", calls, betweens, d, err)
	}
	boom := errors.New("boom")
	if _, err := measure(3, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("an error in f: %v", err)
	}
	if _, err := measureBetween(3, func() error { return boom }, func() error { return nil }); !errors.Is(err, boom) {
		t.Errorf("an error in between: %v", err)
	}
}

// TestThroughput: exactly total calls, however many in flight, and the
// first error.
func TestThroughput(t *testing.T) {
	for _, conc := range []int{1, 3, 16} {
		var calls, inFlight, most atomic.Int64
		rate, err := throughput(50, conc, func() error {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(time.Millisecond)
			inFlight.Add(-1)
			calls.Add(1)
			return nil
		})
		if err != nil || calls.Load() != 50 || rate <= 0 || most.Load() > int64(conc) {
			t.Errorf("%d in flight: %d calls, at most %d at once, %.0f/s, %v", conc, calls.Load(), most.Load(), rate, err)
		}
	}
	boom := errors.New("boom")
	if _, err := throughput(10, 2, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("error: %v", err)
	}
}
