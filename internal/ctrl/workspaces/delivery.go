package workspaces

// This file is delivery: each host's desired executions, derived from
// records, and the fold of what hosts report back into them.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
)

// executionID names the execution that serves one start of a workspace:
// its generation, and the attempt when a failed start was retried.
func executionID(workspaceID string, generation, attempt uint64) string {
	if attempt == 0 {
		return fmt.Sprintf("%s-%d", workspaceID, generation)
	}
	return fmt.Sprintf("%s-%d-%d", workspaceID, generation, attempt)
}

// Assignments returns the complete desired set of a host.
func (s *Service) Assignments(ctx context.Context, hostID string) (*hostv1.WatchAssignmentsResponse, error) {
	out := new(hostv1.WatchAssignmentsResponse)
	now := s.Now.UTC()
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		if out.Volumes, err = volumes.HostAssignments(ctx, tx, hostID); err != nil {
			return err
		}
		// No drain outlasts its longest: older deletions hold no connection.
		if out.DeletedEgressIds, err = tx.DeletedObjects(ctx, store.KindEgress, now.Add(-resource.MaxDrainSeconds*time.Second)); err != nil {
			return err
		}
		records, err := s.hostRecords(ctx, tx, hostID)
		if err != nil {
			return err
		}
		exposures, err := s.exposureAssignments(ctx, tx, hostID)
		if err != nil {
			return err
		}
		launches := map[string]*hostv1.Launch{}
		for _, r := range records {
			a := r.assignment(now)
			if ref := r.ws.Spec.GetLaunchRef(); ref != "" {
				if launches[ref] == nil {
					if launches[ref], err = launchOf(ctx, tx, ref); err != nil {
						return err
					}
				}
				a.Launch = launches[ref]
			}
			if a.Desired == hostv1.DesiredState_DESIRED_STATE_RUNNING {
				if a.Network, err = networkAssignment(ctx, tx, r); err != nil {
					return err
				}
				a.Exposures = exposures[r.row.ID]
			}
			if a.Volume, err = executionVolume(ctx, tx, r); err != nil {
				return err
			}
			out.Assignments = append(out.Assignments, a)
		}
		return nil
	})
	return out, err
}

// AssignsBlob reports whether a layer of the template of an execution
// assigned to hostID has digest: the blobs the host fetches to deliver
// its executions' templates.
func (s *Service) AssignsBlob(ctx context.Context, hostID, digest string) (bool, error) {
	found := false
	err := s.Store.View(ctx, func(tx store.Tx) error {
		records, err := s.hostRecords(ctx, tx, hostID)
		if err != nil {
			return err
		}
		found = slices.ContainsFunc(records, func(r *record) bool {
			return slices.ContainsFunc(r.book.Image.Layers, func(l templates.Layer) bool { return l.Digest == digest })
		})
		return nil
	})
	return found, err
}

// hostRecords returns the records of the live workspaces placed on a
// host, decoded once per version (decodedCache).
func (s *Service) hostRecords(ctx context.Context, tx store.Tx, hostID string) ([]*record, error) {
	rows, err := tx.HostWorkspaces(ctx, hostID)
	if err != nil {
		return nil, err
	}
	return s.decoded.of(hostID, rows)
}

func (r *record) assignment(now time.Time) *hostv1.Assignment {
	res := proto.CloneOf(r.ws.GetSpec().GetResources())
	res.WritableLayerBytes = r.row.LayerBytes
	a := &hostv1.Assignment{
		ExecutionId: executionID(r.row.ID, r.book.Target, r.book.Attempt),
		WorkspaceId: r.row.ID,
		Generation:  r.book.Target,
		Resources:   res,
		LayerId:     r.layerID(),
		Template: &hostv1.ExecutionTemplate{
			TemplateId: r.book.Image.TemplateID, Revision: r.book.Image.Revision,
			ImageDigest: r.book.Image.Digest, Env: r.book.Image.Env,
		},
	}
	a.Restore = r.restoreAssignment()
	if d := r.book.Image.Display; d != nil {
		a.Template.Display = &ctrlv1.TemplateDisplay{Width: d.Width, Height: d.Height}
	}
	for _, l := range r.book.Image.Layers {
		a.Template.Layers = append(a.Template.Layers, &hostv1.TemplateLayer{Digest: l.Digest, DiffId: l.DiffID, SizeBytes: uint64(l.Size)})
	}
	// The host admits data-plane calls while the workspace runs. While
	// it stops, the key still lets the gateway tell the calls it admitted
	// from forged ones: they go on until their processes report the exits
	// that the stop brings about, however long the processes take.
	stopping := r.book.Desired == DesiredStopped && r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
	if dp := &r.book.DataPlane; len(dp.Key) > 0 && (r.book.Desired == DesiredRunning || stopping) {
		a.DataPlane = &hostv1.DataPlane{Key: dp.Key, RevokedSessionIds: dp.revokedIDs(now), ProjectId: r.row.ProjectID}
	}
	switch r.book.Desired {
	case DesiredRunning:
		a.Desired = hostv1.DesiredState_DESIRED_STATE_RUNNING
	case DesiredStopped:
		a.Desired = hostv1.DesiredState_DESIRED_STATE_STOPPED
	case DesiredDeleted:
		a.Desired = hostv1.DesiredState_DESIRED_STATE_DELETED
	}
	if r.book.Desired != DesiredRunning {
		mode := r.book.StopMode
		if r.book.Desired == DesiredDeleted {
			mode = ctrlv1.StopMode_STOP_MODE_FORCE // deletion keeps nothing to sync
		}
		a.Stop = &hostv1.StopRequest{Mode: mode, CommandId: r.book.StopCommand}
	}
	return a
}

// MaxExecutionReports bounds the execution reports of one
// ReportExecutions call, and MaxVolumeReports its Volume reports. An
// agent sends at most the reports it queued while ctrl was unreachable
// (1000) and the latest of each of its executions, and one report per
// Volume it holds: 16384 is twice the executions of a 1 TiB host full of
// the smallest workspaces (128 MiB), and a call that large still takes
// ctrl well under a second.
const (
	MaxExecutionReports = 16384
	MaxVolumeReports    = 16384
)

// CheckReports refuses, as invalid_argument, more execution or Volume
// reports in one call than MaxExecutionReports and MaxVolumeReports.
func CheckReports(reports []*hostv1.ExecutionReport, volumeReports []*hostv1.VolumeReport) error {
	if len(reports) > MaxExecutionReports {
		return invalid("reports holds %d reports; at most %d are sent at once", len(reports), MaxExecutionReports)
	}
	if len(volumeReports) > MaxVolumeReports {
		return invalid("volumes holds %d reports; at most %d are sent at once", len(volumeReports), MaxVolumeReports)
	}
	return nil
}

// Report folds a host's execution reports into the workspaces they serve,
// and its volume reports into the Volumes it holds. Reports of workspaces
// not placed on the host, or of executions that no longer serve their
// workspace, are ignored.
func (s *Service) Report(ctx context.Context, hostID string, reports []*hostv1.ExecutionReport, volumeReports []*hostv1.VolumeReport) error {
	return s.updateAnnouncing(ctx, func(tx store.Tx) ([]string, error) {
		changed, err := s.hostSeen(ctx, tx, hostID)
		if err != nil {
			return changed, err
		}
		vols, err := s.Volumes.Report(ctx, tx, hostID, volumeReports)
		if err != nil {
			return changed, err
		}
		changed = append(changed, vols...)
		ids := make([]string, 0, len(reports))
		for _, rep := range reports {
			ids = append(ids, rep.WorkspaceId)
		}
		rows, err := tx.HostWorkspacesByID(ctx, hostID, ids)
		if err != nil {
			return changed, err
		}
		byID := resource.ByID(rows, func(row store.Workspace) string { return row.ID })
		for _, rep := range reports {
			row, ok := byID[rep.WorkspaceId]
			if !ok {
				continue
			}
			r, err := decode(row)
			if err != nil {
				return changed, err
			}
			if rep.ExecutionId != executionID(row.ID, r.book.Target, r.book.Attempt) {
				continue
			}
			before := proto.CloneOf(r.ws)
			beforeRow := r.row
			if err := s.apply(ctx, tx, r, rep); err != nil {
				return changed, err
			}
			if proto.Equal(before, r.ws) && beforeRow.DeletedAt.Equal(r.row.DeletedAt) && beforeRow.Running == (r.book.Desired == DesiredRunning) {
				continue
			}
			if err := s.save(ctx, tx, r); err != nil {
				return changed, err
			}
			byID[row.ID] = r.row
			changed = append(changed, row.ID)
		}
		return changed, nil
	})
}
