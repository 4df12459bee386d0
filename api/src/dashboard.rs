//! `GET /dashboard`: the developers' web page, served from files built into
//! the binary (no CDN, nothing fetched at run time). The page signs in with an
//! API key kept in the tab's session storage and talks only to the public
//! `/v0` API, so every action obeys the same rules and scopes as the API.

use std::sync::Arc;

use axum::{
    Router,
    http::{HeaderValue, header},
    response::{IntoResponse, Redirect, Response},
    routing::get,
};

/// The page forbids everything but its own files and calls to its own origin:
/// no inline script, no form posts elsewhere; who may frame it is added by
/// [`Branding`].
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'";

/// The files of the page, by path under `/dashboard/`.
const FILES: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("../dashboard/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../dashboard/app.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../dashboard/style.css")),
];

/// The title and accent the files are shipped with.
const DEFAULT_TITLE: &str = "Webhooks";
const DEFAULT_ACCENT: &str = "--accent: #2554c7;";

/// The operator's settings for the page (`PORTAL_FRAME_ANCESTORS`,
/// `PORTAL_TITLE`, `PORTAL_ACCENT_COLOR`), applied once at start: the
/// policy's `frame-ancestors`, and the page and style with the title and
/// colour written in (the title HTML-escaped; both were validated).
#[derive(Debug)]
pub struct Branding {
    policy: HeaderValue,
    /// Whether no page may frame the dashboard (then `X-Frame-Options: DENY`
    /// says so to browsers that ignore `frame-ancestors`).
    deny_frames: bool,
    index: String,
    style: String,
}

impl Branding {
    pub fn new(frame_ancestors: Option<&[String]>, title: Option<&str>, accent: Option<&str>) -> Branding {
        let ancestors = match frame_ancestors {
            Some(origins) if !origins.is_empty() => origins.join(" "),
            _ => "'none'".to_owned(),
        };
        let policy = format!("{POLICY}; frame-ancestors {ancestors}");
        let index = source("index.html");
        let index = match title {
            Some(title) => {
                let title = escape_html(title);
                index.replace("<title>Webhooks dashboard</title>", &format!("<title>{title}</title>")).replace(
                    &format!("<span class=\"brand\">{DEFAULT_TITLE}</span>"),
                    &format!("<span class=\"brand\">{title}</span>"),
                )
            }
            None => index.to_owned(),
        };
        let style = match accent {
            Some(colour) => source("style.css").replace(DEFAULT_ACCENT, &format!("--accent: {colour};")),
            None => source("style.css").to_owned(),
        };
        Branding {
            // Every origin was checked to hold only header-safe characters.
            policy: HeaderValue::from_str(&policy).unwrap_or_else(|_| HeaderValue::from_static(POLICY)),
            deny_frames: frame_ancestors.is_none_or(<[String]>::is_empty),
            index,
            style,
        }
    }

    /// The page as the settings of `config` brand it.
    pub fn from_config(config: &crate::config::Config) -> Branding {
        Branding::new(
            config.portal_frame_ancestors.as_ref().map(|a| a.0.as_slice()),
            config.portal_title.as_deref(),
            config.portal_accent_color.as_deref(),
        )
    }
}

impl Default for Branding {
    fn default() -> Branding {
        Branding::new(None, None, None)
    }
}

fn source(name: &str) -> &'static str {
    FILES.iter().find(|(path, _, _)| *path == name).map_or("", |(_, _, body)| body)
}

fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The dashboard's routes, outside `/v0` and without authentication: the
/// page itself holds no data; it asks the API with the key it is given.
pub fn router<S: Clone + Send + Sync + 'static>(branding: Branding) -> Router<S> {
    let branding = Arc::new(branding);
    let page = branding.clone();
    Router::new()
        .route(
            "/dashboard",
            get(move || {
                let page = page.clone();
                async move { file(&page, "index.html") }
            }),
        )
        .route("/dashboard/", get(|| async { Redirect::permanent("/dashboard") }))
        .route(
            "/dashboard/{file}",
            get(move |axum::extract::Path(name): axum::extract::Path<String>| {
                let branding = branding.clone();
                async move { file(&branding, &name) }
            }),
        )
}

fn file(branding: &Branding, name: &str) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(path, _, _)| *path == name) else {
        return crate::error::ApiError::NotFound.into_response();
    };
    let body = match name {
        "index.html" => branding.index.clone(),
        "style.css" => branding.style.clone(),
        _ => (*body).to_owned(),
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, branding.policy.clone());
    if branding.deny_frames {
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page names only files that are served, and nothing its policy
    /// would block: no inline script or style, no markup built from strings.
    #[test]
    fn the_page_uses_only_served_files_and_keeps_to_its_policy() {
        let (_, _, index) = FILES.iter().find(|(path, _, _)| *path == "index.html").unwrap();
        for reference in index.split("\"/dashboard/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(FILES.iter().any(|(path, _, _)| *path == name), "index.html names {name}, which is not served");
        }
        for (path, _, body) in FILES {
            assert!(!body.contains(" style="), "{path} has a style attribute");
            assert!(!body.contains("innerHTML") && !body.contains("outerHTML ="), "{path} writes markup from strings");
            assert!(!body.contains("=\"http") && !body.contains("url(http"), "{path} loads from elsewhere");
        }
        assert!(!index.contains("<script>"), "index.html has an inline script");
        assert!(!index.contains("<style"), "index.html has an inline style");
    }

    #[test]
    fn files_are_served_with_the_policy_and_unknown_ones_are_404() {
        let branding = Branding::default();
        let response = file(&branding, "app.js");
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[header::CONTENT_SECURITY_POLICY], format!("{POLICY}; frame-ancestors 'none'"));
        assert_eq!(response.headers()[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(file(&branding, "../Cargo.toml").status(), 404);
        assert_eq!(file(&branding, "nothing.js").status(), 404);
    }

    #[test]
    fn the_settings_brand_the_page_and_allow_their_frames() {
        assert!(source("index.html").contains("<title>Webhooks dashboard</title>"));
        assert!(source("index.html").contains("<span class=\"brand\">Webhooks</span>"));
        assert!(source("style.css").contains(DEFAULT_ACCENT));
        let origins = ["https://console.example.com".to_owned(), "http://localhost:3000".to_owned()];
        let branding = Branding::new(Some(&origins), Some("Acme <Pay>"), Some("#1a7f5a"));
        let page = file(&branding, "index.html");
        assert_eq!(
            page.headers()[header::CONTENT_SECURITY_POLICY],
            format!("{POLICY}; frame-ancestors https://console.example.com http://localhost:3000")
        );
        assert!(page.headers().get(header::X_FRAME_OPTIONS).is_none());
        assert!(branding.index.contains("<title>Acme &lt;Pay&gt;</title>"), "{}", branding.index);
        assert!(branding.index.contains("<span class=\"brand\">Acme &lt;Pay&gt;</span>"));
        assert!(branding.style.contains("--accent: #1a7f5a;") && !branding.style.contains(DEFAULT_ACCENT));
    }
}
