package pep

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"
)

type scratchBlock struct {
	Type    string `json:"type"`
	Content string `json:"content"`
	Start   int    `json:"start"`
	End     int    `json:"end"`
}

func TestScratch(t *testing.T) {
	data, _ := os.ReadFile("/tmp/cases723.json")
	var cases []struct {
		In  string         `json:"in"`
		Out []scratchBlock `json:"out"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for _, c := range cases {
		var got []scratchBlock
		for b := range findBlocks(c.In) {
			got = append(got, scratchBlock{b.typ, b.content, b.start, b.end})
		}
		if len(got) == 0 && len(c.Out) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, c.Out) {
			bad++
			if bad < 5 {
				t.Errorf("%q: got %+v want %+v", c.In, got, c.Out)
			}
		}
	}
	t.Logf("%d cases, %d bad", len(cases), bad)
}
