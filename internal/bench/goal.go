package bench

import (
	"bytes"
	"fmt"
	"io"
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

// missCounter passes a report through and counts its rows that missed
// their goal, so that the report can end by saying what a MISSED means
// and where to read more; a row alone left a user guessing.
type missCounter struct {
	w      io.Writer
	missed int
	tail   []byte // the end of the last write, for a mark split between two
}

const missedMark = " MISSED"

func (m *missCounter) Write(p []byte) (int, error) {
	joined := append(m.tail, p...)
	// Marks wholly inside the last tail were counted with it.
	m.missed += bytes.Count(joined, []byte(missedMark)) - bytes.Count(m.tail, []byte(missedMark))
	m.tail = append([]byte(nil), joined[max(0, len(joined)-len(missedMark)+1):]...)
	return m.w.Write(p)
}

// footer is the report's last lines when a row missed its goal.
func (m *missCounter) footer() string {
	if m.missed == 0 {
		return ""
	}
	rows := "1 row"
	if m.missed > 1 {
		rows = fmt.Sprintf("%d rows", m.missed)
	}
	return fmt.Sprintf("\n%s MISSED the goal in brackets. The goals, what each row measures and the figures measured on a 2-core VM are in docs/performance.md (\"How fast, measured\"). Only the ratios within one run compare: other load on the machine (the busy rows above all) and its speed, which can move by 2-3x, shift them, so run again on a quiet machine before reading much into one miss.\n", rows)
}
