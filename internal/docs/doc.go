// Package docs holds the checks of the project's documentation: the
// README's (and, as they come, the guides') links and anchors resolve.
// It has no code of its own; its tests read the files.
package docs
