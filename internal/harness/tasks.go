package harness

import (
	"context"
	"errors"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
)

// maxTaskMessage bounds a task's status message in an event: the server
// writes it, and an event stream is no place for a novel.
const maxTaskMessage = 500

// taskWatch ties the call of ledger entry key to the task its server may
// answer with: a new task's id is written to the pending entry (and
// announced) before anyone waits on it, a pending entry's task is waited
// on again, and status changes become step.task events.
func (r *run) taskWatch(ctx context.Context, n *document.Node, key string, resume bool) *connect.TaskWatch {
	w := &connect.TaskWatch{Cancels: cancelsTask}
	if resume {
		r.mu.Lock()
		if i := r.entry(key); i >= 0 {
			w.Resume = r.rec.Steps[i].Task
		}
		r.mu.Unlock()
	}
	w.Started = func(ctx context.Context, id string) error {
		r.update(key, func(st *StepRecord) { st.Task = id })
		return r.saveWith(ctx, "", event{EventStepTask, taskEvent(n, key, connect.TaskProgress{ID: id, Status: "working"})})
	}
	w.Progress = func(t connect.TaskProgress) {
		r.e.emit(ctx, r.rec.ID, EventStepTask, taskEvent(n, key, t))
	}
	return w
}

func taskEvent(n *document.Node, key string, t connect.TaskProgress) map[string]any {
	data := map[string]any{"key": key, "id": n.ID, "task": t.ID, "status": t.Status}
	if t.Message != "" {
		data["message"] = connect.Excerpt(t.Message, maxTaskMessage)
	}
	return data
}

// cancelsTask reports whether a call cut short by ctx gives up its task:
// the execution was cancelled, or a sibling path won a parallel any. A
// runner that stops (fenced, storage lost, shut down) leaves the task
// running for the run that resumes it.
func cancelsTask(ctx context.Context) bool {
	cause := context.Cause(ctx)
	return errors.Is(cause, errCancelled) || errors.Is(cause, errAnyWon)
}
