package console

import "testing"

func TestInert(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"print('hi')\n\tx = 1", "print('hi')\n\tx = 1"},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"a\u202eevil", `a\u202eevil`},
		{"\u2066x\u2069", `\u2066x\u2069`},
		{"zero\u200bwidth\ufeff", `zero\u200bwidth\ufeff`},
		{"cr\rover", `cr\x0dover`},
		{"nul\x00", `nul\x00`},
		{"c1\u009b31m", `c1\u009b31m`},
		{"línea ✓ 日本", "línea ✓ 日本"},
		{"eval\ufe00 = print", `eval\ufe00 = print`},
		{"print\u3164 x\U000e0100 \u034f\u115f\uffa0", `print\u3164 x\U000e0100 \u034f\u115f\uffa0`},
		{"bad \xff byte", "bad \ufffd byte"},
	} {
		if got := inert(tc.in); got != tc.want {
			t.Errorf("inert(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
