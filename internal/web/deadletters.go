package web

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/triggers"
)

func (h *handler) deadLetters(c echo.Context) error {
	var items []triggers.DeadLetter
	if h.Triggers != nil {
		var err error
		if items, err = h.Triggers.DeadLetters(bg(c)); err != nil {
			return err
		}
	}
	return h.render(c, http.StatusOK, deadLettersPage(h.page(c, "Dead letters", "deadletters"), h.Triggers != nil, items))
}

// redeliver puts a dead letter back in its inbox through the same
// triggers.Service call as POST /v1/deadletters/{id}/redeliver.
func (h *handler) redeliver(c echo.Context) error {
	if h.Triggers == nil {
		return &notFound{"Triggers are not configured."}
	}
	_, err := h.Triggers.Redeliver(bg(c), c.Param("id"))
	if errors.Is(err, triggers.ErrDeadLetterNotFound) {
		return c.Redirect(http.StatusSeeOther, "/admin/deadletters?flash=gone")
	}
	if err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/admin/deadletters?flash=redelivered")
}
