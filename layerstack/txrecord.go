package layerstack

// Committed reports whether transaction txid committed, without writing
// anything: the daemon asks before it aborts a publish whose commit it has
// no record of (a crash between the store's commit and the daemon's own
// record). Publish with the same TxID then returns the recorded result.
func (s *Store) Committed(txid string) (bool, error) {
	if txid == "" {
		return false, nil
	}
	_, err := s.readTx(txid)
	if isNotExist(err) {
		return false, nil
	}
	return err == nil, err
}
