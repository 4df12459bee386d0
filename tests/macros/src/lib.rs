//! `#[tests::test]`: a black-box test that runs once per backend.
//!
//! ```ignore
//! #[tests::test]
//! async fn a_key_is_shown_once() { /* TestApi::start() ... */ }
//!
//! #[tests::test(distributed)]
//! async fn the_broker_restarts() { /* ... */ }
//! ```
//!
//! The first becomes a module `a_key_is_shown_once` holding two tests,
//! `distributed` and `standalone`, each running the body on a multi-threaded
//! runtime with `tests::Backend::current()` set to its backend (so
//! `TestApi::start` starts that deployment). Naming backends runs only
//! those: a test of something one deployment does not have.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::quote;
use syn::{Ident, ItemFn, parse::Parser, parse_macro_input, punctuated::Punctuated, spanned::Spanned};

const BACKENDS: [&str; 2] = ["distributed", "standalone"];

#[proc_macro_attribute]
pub fn test(attr: TokenStream, item: TokenStream) -> TokenStream {
    let named = match Punctuated::<Ident, syn::Token![,]>::parse_terminated.parse(attr) {
        Ok(named) => named,
        Err(error) => return error.to_compile_error().into(),
    };
    for backend in &named {
        if !BACKENDS.contains(&backend.to_string().as_str()) {
            let message = format!("unknown backend `{backend}`: expected `distributed` or `standalone`");
            return syn::Error::new(backend.span(), message).to_compile_error().into();
        }
    }
    let function = parse_macro_input!(item as ItemFn);
    if function.sig.asyncness.is_none() || !function.sig.inputs.is_empty() {
        let message = "#[tests::test] takes an `async fn` without arguments";
        return syn::Error::new(function.sig.span(), message).to_compile_error().into();
    }
    let ItemFn { attrs, sig, block, .. } = function;
    let name = &sig.ident;
    // Doc comments describe the test: they stay on the module; any other
    // attribute (`#[ignore]`, say) goes on each test.
    let (docs, others): (Vec<_>, Vec<_>) = attrs.into_iter().partition(|a| a.path().is_ident("doc"));
    let backends: Vec<&str> = if named.is_empty() {
        BACKENDS.to_vec()
    } else {
        BACKENDS.iter().copied().filter(|b| named.iter().any(|n| n == b)).collect()
    };
    let tests = backends.iter().map(|backend| {
        let test = Ident::new(backend, Span::call_site());
        let variant =
            Ident::new(if *backend == "distributed" { "Distributed" } else { "Standalone" }, Span::call_site());
        quote! {
            #(#others)*
            #[::tokio::test(flavor = "multi_thread")]
            async fn #test() {
                ::tests::Backend::#variant.scope(async move #block).await
            }
        }
    });
    quote! {
        #(#docs)*
        mod #name {
            #[allow(unused_imports)]
            use super::*;
            #(#tests)*
        }
    }
    .into()
}
