//! One error type for every interface: REST maps it to a status code and a JSON body, MCP to
//! a tool result with `isError`.

use cairn_harness::HarnessError;
use cairn_store::StoreError;
use serde::Serialize;

/// What went wrong, in the terms a client can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No or a wrong API key (401).
    Unauthorized,
    /// The request could not be read: not JSON, or not the expected shape (400).
    BadRequest,
    /// A field has a value that is not accepted (422).
    InvalidInput,
    /// No memory with this id in the caller's namespace (404).
    NotFound,
    /// The body or a batch is over its limit (413).
    TooLarge,
    /// The request conflicts with what is stored (409): a duplicate id, a memory still cited.
    Conflict,
    /// The server failed; nothing was written (500).
    Internal,
    /// The server is shutting down (503).
    Unavailable,
}

/// An error returned to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The category.
    pub code: ErrorCode,
    /// What happened, in words.
    pub message: String,
    /// The request field at fault, when one is (`k`, `[2].kind`, ...).
    pub field: Option<String>,
}

impl ApiError {
    fn new(code: ErrorCode, field: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: field.map(str::to_owned),
        }
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, None, message)
    }

    /// 400.
    pub fn bad_request(field: Option<&str>, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, field, message)
    }

    /// 422.
    pub fn invalid(field: Option<&str>, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidInput, field, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, None, message)
    }

    /// 413.
    pub fn too_large(field: Option<&str>, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::TooLarge, field, message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, None, message)
    }

    /// 503.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, None, message)
    }

    /// The same error blaming `field` (kept when one is already named).
    pub fn at(mut self, field: impl Into<String>) -> Self {
        if self.field.is_none() {
            self.field = Some(field.into());
        }
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self.code {
            ErrorCode::Unauthorized => 401,
            ErrorCode::BadRequest => 400,
            ErrorCode::InvalidInput => 422,
            ErrorCode::NotFound => 404,
            ErrorCode::TooLarge => 413,
            ErrorCode::Conflict => 409,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable => 503,
        }
    }
}

impl From<HarnessError> for ApiError {
    fn from(e: HarnessError) -> Self {
        let message = e.to_string();
        match e {
            HarnessError::NotFound { .. } => Self::not_found(message),
            HarnessError::Input(_) | HarnessError::Config(_) => Self::invalid(None, message),
            HarnessError::Embed(cairn_core::EmbedError::Input(_)) => Self::invalid(None, message),
            HarnessError::Store(s) => match s {
                StoreError::DuplicateId { .. }
                | StoreError::CitedBySummaries { .. }
                | StoreError::CannotSupersede { .. }
                // The store was re-embedded with another model since it was opened.
                | StoreError::ModelMismatch { .. } => {
                    Self::new(ErrorCode::Conflict, None, message)
                }
                StoreError::NotASummary { .. }
                | StoreError::EmptySources
                | StoreError::DuplicateSource { .. }
                | StoreError::SelfReference { .. }
                | StoreError::Cycle { .. }
                | StoreError::ThreadMismatch { .. } => Self::invalid(None, message),
                _ => Self::internal(message),
            },
            HarnessError::Task(_) => Self::unavailable(message),
            _ => Self::internal(message),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Self::from(HarnessError::from(e))
    }
}

/// The JSON body of an error response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What an error response says.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// The category.
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
    /// The request field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl From<&ApiError> for ErrorBody {
    fn from(e: &ApiError) -> Self {
        Self {
            error: ErrorDetail {
                code: e.code,
                message: e.message.clone(),
                field: e.field.clone(),
            },
        }
    }
}
