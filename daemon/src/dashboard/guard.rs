//! What every dashboard response goes through: GET (and HEAD) only, the bearer token on
//! `/api/`, and the headers that keep a browser from doing more than showing the pages.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The Content-Security-Policy of every response: the pages' own script, style and images
/// only, no inline script or style, no framing, no plugins.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// A bearer token, compared in constant time.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// The token `text` (its first line, trimmed); `None` if empty.
    pub fn parse(text: &str) -> Option<Self> {
        let t = text.lines().next().unwrap_or_default().trim();
        (!t.is_empty()).then(|| Self(Arc::from(t.as_bytes())))
    }

    /// Whether `headers` carry `Authorization: Bearer <this token>`.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let Some(given) = value
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
            .and_then(|_| value.get(7..))
        else {
            return false;
        };
        constant_time_eq(given, &self.0)
    }
}

/// Whether `a == b`, in a time that depends on their lengths only (not on where they differ).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // Every byte of the longer is read whatever the contents.
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

/// Sets the headers every response carries.
pub fn harden(headers: &mut HeaderMap) {
    let set = |h: &mut HeaderMap, name: header::HeaderName, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(headers, header::CONTENT_SECURITY_POLICY, CSP);
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    set(headers, header::CACHE_CONTROL, "no-store");
    // No Access-Control-* header: another origin's page cannot read a response.
    headers.remove(header::ACCESS_CONTROL_ALLOW_ORIGIN);
}

/// The middleware: 405 for any method but GET and HEAD, 401 for an `/api/` request without
/// the token (when one is set), the hardening headers on everything.
pub async fn guard(token: Option<Token>, request: Request, next: Next) -> Response {
    let mut response = if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = (
            StatusCode::METHOD_NOT_ALLOWED,
            "the dashboard is read-only: GET only\n",
        )
            .into_response();
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        r
    } else if request.uri().path().starts_with("/api/")
        && token.as_ref().is_some_and(|t| !t.admits(request.headers()))
    {
        let mut r = (
            StatusCode::UNAUTHORIZED,
            "this dashboard needs its token: Authorization: Bearer <token>\n",
        )
            .into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"fqdnd\""),
        );
        r
    } else {
        next.run(request).await
    };
    harden(response.headers_mut());
    response
}
