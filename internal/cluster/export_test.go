package cluster

// SignHandoff signs h as a replica with key would, for tests that write
// records of their own into the store.
func SignHandoff(key []byte, h Handoff) Handoff {
	h.Sig = h.mac(key)
	return h
}
