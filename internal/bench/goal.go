package bench

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"
)

// goalRE is a goal as the report writes it: a comparison with a number of
// times ("<= 0.30x", ">= 2x") or of milliseconds ("p50 < 1ms", "<= 1ms
// added").
var goalRE = regexp.MustCompile(`(<=|>=|<|>)\s*([0-9.]+)(x|ms)`)

// goalNote is " (goal G)", with " MISSED" after it when the measured
// value is outside it: ratio for a goal in times, millis for one in
// milliseconds.
func goalNote(goal string, ratio, millis float64) string {
	if goal == "" {
		return ""
	}
	note := fmt.Sprintf(" (goal %s)", goal)
	if goalMissed(goal, ratio, millis) {
		note += " MISSED"
	}
	return note
}

func goalMissed(goal string, ratio, millis float64) bool {
	m := goalRE.FindStringSubmatch(goal)
	if m == nil {
		return false
	}
	limit, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		return false
	}
	v := ratio
	if m[3] == "ms" {
		v = millis
	}
	// As the report shows it: a ratio printed as 1.10x meets <= 1.10x.
	v = math.Round(v*100) / 100
	switch m[1] {
	case "<=":
		return !(v <= limit)
	case ">=":
		return !(v >= limit)
	case "<":
		return !(v < limit)
	}
	return !(v > limit)
}

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
