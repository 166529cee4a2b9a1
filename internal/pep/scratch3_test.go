package pep

import ("testing"; "encoding/json"; "os"; "fmt"; "sort")

func TestScratchReq(t *testing.T) {
	data, _ := os.ReadFile("/tmp/casesreq.json")
	var cases []struct{ In string; Ok bool; Err string; Name string; Spec string; URL string; Marker string }
	if err := json.Unmarshal(data, &cases); err != nil { t.Fatal(err) }
	buckets := map[string][]string{}
	for _, c := range cases {
		r, err := ParseRequirement(c.In)
		if (err == nil) != c.Ok {
			k := fmt.Sprintf("ours=%v", err == nil)
			msg := fmt.Sprintf("%q ours=%v pkg=%s", c.In, err, c.Err)
			buckets[k] = append(buckets[k], msg)
			continue
		}
		if err == nil && (r.Name != c.Name || r.URL != c.URL) { t.Errorf("%q: %+v vs %+v", c.In, r, c) }
	}
	for k, v := range buckets {
		sort.Strings(v)
		fmt.Println("==", k, len(v))
		step := len(v)/60 + 1
		for i := 0; i < len(v); i += step { fmt.Println(v[i]) }
	}
}
