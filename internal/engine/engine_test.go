package engine

import (
	"context"
	"testing"
)

func TestHello(t *testing.T) {
	e := newEngine(t, nil)
	r, err := e.Run(context.Background(), RunRequest{Code: "print('hi')\n1+1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
}
