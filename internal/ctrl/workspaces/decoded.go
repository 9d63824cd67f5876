package workspaces

import (
	"bytes"
	"sync"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// decodedBodies keeps decoded records with the bodies they came from, so
// that a body the same as last time is decoded no more (JSON with the
// message in it, 10 to 17 µs a workspace). Records it returns share their
// resource and bookkeeping with later calls' and must only be read.
//
// It keeps, for each host, the records its last desired set was computed
// from: every change of any workspace recomputes every host's set, reading
// all of its workspaces, and decoding their bodies was half of that. And it
// keeps the records that reads presented (GetWorkspace, ListWorkspaces),
// up to maxReadBodies.
type decodedBodies struct {
	mu     sync.Mutex
	byHost map[string]map[string]decodedBody // host → workspace ID → body
	read   map[readKey]decodedBody
}

// maxReadBodies bounds the records kept for reads; past it, an arbitrary
// one makes room.
const maxReadBodies = 1024

type readKey struct{ projectID, id string }

type decodedBody struct {
	body []byte
	ws   *ctrlv1.Workspace
	book bookkeeping
}

// of returns the records of a host's rows, decoding the bodies that
// changed since its last call, and forgets the workspaces the host no
// longer holds.
func (d *decodedBodies) of(hostID string, rows []store.Workspace) ([]*record, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	last, now := d.byHost[hostID], make(map[string]decodedBody, len(rows))
	records := make([]*record, 0, len(rows))
	for _, row := range rows {
		kept, ok := last[row.ID]
		b, err := kept.of(row, ok)
		if err != nil {
			return nil, err
		}
		now[row.ID] = b
		records = append(records, &record{row: row, ws: b.ws, book: b.book})
	}
	if d.byHost == nil {
		d.byHost = map[string]map[string]decodedBody{}
	}
	d.byHost[hostID] = now
	return records, nil
}

// forRead returns the record of a row that a read presents and does not
// change (Get, List), decoding the body only when it is not the one
// decoded last for that workspace.
func (d *decodedBodies) forRead(row store.Workspace) (*record, error) {
	key := readKey{row.ProjectID, row.ID}
	d.mu.Lock()
	kept, ok := d.read[key]
	d.mu.Unlock()
	b, err := kept.of(row, ok)
	if err != nil {
		return nil, err
	}
	if b.ws != kept.ws { // decoded anew
		d.mu.Lock()
		if d.read == nil {
			d.read = map[readKey]decodedBody{}
		}
		if _, ok := d.read[key]; !ok && len(d.read) >= maxReadBodies {
			for k := range d.read {
				delete(d.read, k)
				break
			}
		}
		d.read[key] = b
		d.mu.Unlock()
	}
	return &record{row: row, ws: b.ws, book: b.book}, nil
}

// of returns b when it is row's body decoded (ok: b was kept), and row's
// body decoded anew otherwise.
func (b decodedBody) of(row store.Workspace, ok bool) (decodedBody, error) {
	if ok && bytes.Equal(b.body, row.Body) {
		return b, nil
	}
	r, err := decode(row)
	if err != nil {
		return decodedBody{}, err
	}
	return decodedBody{body: row.Body, ws: r.ws, book: r.book}, nil
}
