package tools

import (
	"fmt"
	"strings"
	"testing"
)

func TestValidateScript(t *testing.T) {
	cs := connect(t, nil)
	t.Run("valid", func(t *testing.T) {
		res, out := call(t, cs, "validate_script", map[string]any{"code": "import os\nawait x()\nprint(1)\n"})
		if res.IsError || out["valid"] != true || out["syntax_error"] != nil {
			t.Fatalf("valid code: %s %v", text(res), out)
		}
	})
	t.Run("syntax error", func(t *testing.T) {
		_, out := call(t, cs, "validate_script", map[string]any{"code": "x = 1\nif x\n    print(x)\n"})
		se, _ := out["syntax_error"].(map[string]any)
		if out["valid"] != false || se["line"] != 2.0 || se["column"] == nil || !strings.Contains(se["message"].(string), "expected ':'") {
			t.Fatalf("syntax error: %v", out)
		}
	})
	t.Run("never runs", func(t *testing.T) {
		// If the code ran, it would take 60 s and print; validating must not.
		res, out := call(t, cs, "validate_script", map[string]any{"code": "import time\ntime.sleep(60)\nraise SystemExit(3)\n"})
		if res.IsError || out["valid"] != true {
			t.Fatalf("%s", text(res))
		}
	})
	t.Run("pep 723", func(t *testing.T) {
		code := "# /// script\n# requires-python = \">=3.8\"\n# dependencies = [\"requests<3\", \"rich\"]\n# ///\nprint(1)\n"
		_, out := call(t, cs, "validate_script", map[string]any{"code": code, "dependencies": []any{"numpy>=1.20", "bad dep!!", "rich"}})
		if out["script_block"] != true || out["requires_python"] != ">=3.8" {
			t.Fatalf("block not parsed: %v", out)
		}
		// The interpreter a run would get: the server's, by its path.
		if py, _ := out["python"].(string); !strings.Contains(py, "/") {
			t.Errorf("python %q", py)
		}
		deps := out["dependencies"].([]any)
		var names []string
		for _, d := range deps {
			m := d.(map[string]any)
			names = append(names, m["requirement"].(string))
			if m["requirement"] == "bad dep!!" && (m["valid"] != false || m["error"] == "") {
				t.Errorf("invalid requirement accepted: %v", m)
			}
			if m["requirement"] == "requests<3" && (m["valid"] != true || m["name"] != "requests") {
				t.Errorf("valid requirement: %v", m)
			}
		}
		if strings.Join(names, ",") != "requests<3,rich,numpy>=1.20,bad dep!!" {
			t.Errorf("merged dependencies %v", names)
		}
		if out["valid"] != false || len(out["problems"].([]any)) != 1 {
			t.Errorf("want exactly one problem (the bad requirement): %v", out["problems"])
		}
	})
	t.Run("pep 723 with invalid entries", func(t *testing.T) {
		// The block is still a block: its requires-python and every entry
		// are reported, and each invalid one is a problem with its line.
		code := "# /// script\n# requires-python = \">=3.8\"\n# dependencies = [\n#   \"requests\",\n#   \"numpy===\",\n#   3,\n#   \"pandas>=2\",\n# ]\n# ///\nprint(1)\n"
		_, out := call(t, cs, "validate_script", map[string]any{"code": code})
		if out["valid"] != false || out["script_block"] != true || out["requires_python"] != ">=3.8" {
			t.Fatalf("%v", out)
		}
		var got []string
		for _, d := range out["dependencies"].([]any) {
			m := d.(map[string]any)
			got = append(got, fmt.Sprintf("%s=%v", m["requirement"], m["valid"]))
		}
		if strings.Join(got, ",") != "requests=true,numpy====false,pandas>=2=true" {
			t.Errorf("dependencies %v", got)
		}
		problems := fmt.Sprint(out["problems"])
		if len(out["problems"].([]any)) != 2 || !strings.Contains(problems, `line 5: dependency "numpy==="`) || !strings.Contains(problems, "line 3: dependencies[2] must be a string") {
			t.Errorf("problems %v", problems)
		}
	})
	t.Run("requires-python unsatisfied", func(t *testing.T) {
		code := "# /// script\n# requires-python = \">=4\"\n# ///\nprint(1)\n"
		_, out := call(t, cs, "validate_script", map[string]any{"code": code})
		if out["valid"] != false || !strings.Contains(out["problems"].([]any)[0].(string), "requires-python") {
			t.Errorf("%v", out)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		res, _ := call(t, cs, "validate_script", map[string]any{"code": "a\x00b"})
		if !res.IsError || !strings.Contains(text(res), "NUL") {
			t.Errorf("%s", text(res))
		}
	})
}
