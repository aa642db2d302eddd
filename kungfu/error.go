package kungfu

import (
	"errors"
	"fmt"
)

// Error is a refusal the caller can act on. Its Code is one of the protocol's
// error codes; transports turn it into the envelope's error object.
type Error struct {
	Code    string
	Message string
	Details any
	// RetryAfter, when set, is copied into the envelope (seconds).
	RetryAfter *int
	// Suggestion, when set, is a value the caller may send instead (a free
	// label after label_reserved); the envelope prints it beside code.
	Suggestion string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf builds an *Error with a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// WithDetails returns e with details attached.
func (e *Error) WithDetails(d any) *Error { e.Details = d; return e }

// AsError extracts a protocol error from err, or nil when err is not one.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// FieldError names one invalid argument in VALIDATION_FAILED details.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Invalid is VALIDATION_FAILED with details.errors listing each field.
func Invalid(errs ...FieldError) *Error {
	msg := "invalid arguments"
	switch {
	case len(errs) > 0 && errs[0].Field == "":
		msg = errs[0].Message
	case len(errs) > 0:
		msg = errs[0].Field + ": " + errs[0].Message
	}
	return &Error{Code: CodeValidationFailed, Message: msg, Details: map[string]any{"errors": errs}}
}

// Protocol error codes used by Dojo. relay's status table is the one place
// that says which HTTP status and next_action each carries.
const (
	CodeUnauthorized        = "UNAUTHORIZED"
	CodeInvalidCredentials  = "INVALID_CREDENTIALS"
	CodeInsufficientCredits = "INSUFFICIENT_CREDITS"
	CodeNotOwner            = "NOT_OWNER"
	CodePrivateKungfu       = "PRIVATE_KUNGFU"
	CodeNotFound            = "NOT_FOUND"
	CodeUnknownTool         = "UNKNOWN_TOOL"
	CodeNameTaken           = "NAME_TAKEN"
	CodeInvalidState        = "INVALID_STATE"
	CodeIdempotencyConflict = "IDEMPOTENCY_CONFLICT"
	CodePayloadTooLarge     = "PAYLOAD_TOO_LARGE"
	CodeContentTooLarge     = "CONTENT_TOO_LARGE"
	CodeValidationFailed    = "VALIDATION_FAILED"
	CodeInvalidName         = "INVALID_NAME"
	CodeInvalidPassword     = "INVALID_PASSWORD"
	CodeReservedName        = "RESERVED_NAME"
	CodeInvalidCode         = "INVALID_CODE"
	CodeContentTooShort     = "CONTENT_TOO_SHORT"
	CodeTitleTooLong        = "TITLE_TOO_LONG"
	CodeDescriptionTooLong  = "DESCRIPTION_TOO_LONG"
	CodeTooManyTags         = "TOO_MANY_TAGS"
	CodeTagTooLong          = "TAG_TOO_LONG"
	CodeInvalidTags         = "INVALID_TAGS"
	CodeSensitiveContent    = "SENSITIVE_CONTENT"
	CodeMissingField        = "MISSING_FIELD"
	CodeInvalidRequest      = "INVALID_REQUEST"
	CodeRateLimit           = "RATE_LIMIT"
	CodeInternal            = "INTERNAL_ERROR"
	// A dependency (Redis) is down: nothing was done; retry after a while.
	CodeServiceUnavailable = "SERVICE_UNAVAILABLE"
	// Transport refusals: a browser from another origin, a body that is not JSON.
	CodeForbiddenOrigin      = "FORBIDDEN_ORIGIN"
	CodeUnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE"

	// Rooms and assignments.
	CodeThreadNotFound  = "THREAD_NOT_FOUND"
	CodeAssignNotFound  = "ASSIGN_NOT_FOUND"
	CodeNotMember       = "NOT_MEMBER"
	CodeNotGovernor     = "NOT_GOVERNOR"
	CodeReadOnly        = "READ_ONLY"
	CodeNotYours        = "NOT_YOURS"
	CodeKeyInvalid      = "KEY_INVALID"
	CodeThreadClosed    = "THREAD_CLOSED"
	CodeRoomLimit       = "ROOM_LIMIT"
	CodeMemberLimit     = "MEMBER_LIMIT"
	CodeLastManager     = "LAST_MANAGER"
	CodeInvalidTarget   = "INVALID_TARGET"
	CodeSummaryRequired = "SUMMARY_REQUIRED"
	CodeSchemaMismatch  = "SCHEMA_MISMATCH"

	// Tasks.
	CodeTaskNotFound        = "TASK_NOT_FOUND"
	CodeSubmissionNotFound  = "SUBMISSION_NOT_FOUND"
	CodeHarnessRefNotFound  = "HARNESS_REF_NOT_FOUND"
	CodeTaskNotOpen         = "TASK_NOT_OPEN"
	CodeSlotsExhausted      = "SLOTS_EXHAUSTED"
	CodeSubmissionLimit     = "SUBMISSION_LIMIT"
	CodeClaimRequired       = "CLAIM_REQUIRED"
	CodeClaimInvalid        = "CLAIM_INVALID"
	CodeHasReservations     = "HAS_RESERVATIONS"
	CodeNothingToRefund     = "NOTHING_TO_REFUND"
	CodeOwnTask             = "OWN_TASK"
	CodeCredentialInPayload = "CREDENTIAL_IN_PAYLOAD"
	CodeInvalidRevises      = "INVALID_REVISES"
	CodeInvalidRequestKey   = "INVALID_REQUEST_KEY"

	// The KarmaDue door (kd-mcp-v1 signed calls). KarmaDue's own codes are
	// lower case; its clients match them as sent.
	CodeSignatureRequired = "signature_required"
	CodeStaleSignature    = "stale_signature"
	CodeBadNonce          = "bad_nonce"
	CodeBadSignature      = "bad_signature"
	CodeReplay            = "replay"
	CodeAgentMismatch     = "agent_mismatch"
	CodeForbidden         = "forbidden"
	// A label refused because a live agent holds it or one like it.
	CodeLabelReserved = "label_reserved"
	// The label is held by the caller's own agent.
	CodeLabelYours = "label_yours"
)
