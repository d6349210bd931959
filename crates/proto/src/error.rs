//! RFC 6120 error conditions: stream errors (§4.9) and stanza errors (§8.3).
//! Every error the server sends is built here, so the XML shape is right in
//! one place.

use crate::ns;
use starling_xml::Element;

macro_rules! conditions {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }
        impl $name {
            /// The element name of this condition.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
            /// Parses an element name back into a condition.
            #[allow(clippy::should_implement_trait)]
            pub fn from_str(s: &str) -> Option<Self> {
                match s { $($text => Some(Self::$variant),)+ _ => None }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

conditions!(
    /// RFC 6120 §4.9.3 stream error conditions.
    StreamErrorCondition {
        /// §4.9.3.1
        BadFormat => "bad-format",
        /// §4.9.3.2
        BadNamespacePrefix => "bad-namespace-prefix",
        /// §4.9.3.3
        Conflict => "conflict",
        /// §4.9.3.4
        ConnectionTimeout => "connection-timeout",
        /// §4.9.3.5
        HostGone => "host-gone",
        /// §4.9.3.6
        HostUnknown => "host-unknown",
        /// §4.9.3.7
        ImproperAddressing => "improper-addressing",
        /// §4.9.3.8
        InternalServerError => "internal-server-error",
        /// §4.9.3.9
        InvalidFrom => "invalid-from",
        /// §4.9.3.10
        InvalidNamespace => "invalid-namespace",
        /// §4.9.3.11
        InvalidXml => "invalid-xml",
        /// §4.9.3.12
        NotAuthorized => "not-authorized",
        /// §4.9.3.13
        NotWellFormed => "not-well-formed",
        /// §4.9.3.14
        PolicyViolation => "policy-violation",
        /// §4.9.3.15
        RemoteConnectionFailed => "remote-connection-failed",
        /// §4.9.3.16
        Reset => "reset",
        /// §4.9.3.17
        ResourceConstraint => "resource-constraint",
        /// §4.9.3.18
        RestrictedXml => "restricted-xml",
        /// §4.9.3.19
        SeeOtherHost => "see-other-host",
        /// §4.9.3.20
        SystemShutdown => "system-shutdown",
        /// §4.9.3.21
        UndefinedCondition => "undefined-condition",
        /// §4.9.3.22
        UnsupportedEncoding => "unsupported-encoding",
        /// §4.9.3.23
        UnsupportedFeature => "unsupported-feature",
        /// §4.9.3.24
        UnsupportedStanzaType => "unsupported-stanza-type",
        /// §4.9.3.25
        UnsupportedVersion => "unsupported-version",
    }
);

conditions!(
    /// RFC 6120 §8.3.3 stanza error conditions.
    StanzaErrorCondition {
        /// §8.3.3.1
        BadRequest => "bad-request",
        /// §8.3.3.2
        Conflict => "conflict",
        /// §8.3.3.3
        FeatureNotImplemented => "feature-not-implemented",
        /// §8.3.3.4
        Forbidden => "forbidden",
        /// §8.3.3.5
        Gone => "gone",
        /// §8.3.3.6
        InternalServerError => "internal-server-error",
        /// §8.3.3.7
        ItemNotFound => "item-not-found",
        /// §8.3.3.8
        JidMalformed => "jid-malformed",
        /// §8.3.3.9
        NotAcceptable => "not-acceptable",
        /// §8.3.3.10
        NotAllowed => "not-allowed",
        /// §8.3.3.11
        NotAuthorized => "not-authorized",
        /// §8.3.3.12
        PolicyViolation => "policy-violation",
        /// §8.3.3.13
        RecipientUnavailable => "recipient-unavailable",
        /// §8.3.3.14
        Redirect => "redirect",
        /// §8.3.3.15
        RegistrationRequired => "registration-required",
        /// §8.3.3.16
        RemoteServerNotFound => "remote-server-not-found",
        /// §8.3.3.17
        RemoteServerTimeout => "remote-server-timeout",
        /// §8.3.3.18
        ResourceConstraint => "resource-constraint",
        /// §8.3.3.19
        ServiceUnavailable => "service-unavailable",
        /// §8.3.3.20
        SubscriptionRequired => "subscription-required",
        /// §8.3.3.21
        UndefinedCondition => "undefined-condition",
        /// §8.3.3.22
        UnexpectedRequest => "unexpected-request",
    }
);

/// RFC 6120 §8.3.2 error types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    /// Retry after providing credentials.
    Auth,
    /// Do not retry (the error cannot be remedied).
    Cancel,
    /// Proceed (the condition was only a warning).
    Continue,
    /// Retry after changing the data sent.
    Modify,
    /// Retry after waiting (the error is temporary).
    Wait,
}

impl ErrorType {
    /// The value of the `type` attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::Auth => "auth",
            ErrorType::Cancel => "cancel",
            ErrorType::Continue => "continue",
            ErrorType::Modify => "modify",
            ErrorType::Wait => "wait",
        }
    }
}

impl StanzaErrorCondition {
    /// The error type RFC 6120 §8.3.3 gives in its examples for this
    /// condition; used unless a caller has a reason to pick another.
    pub fn default_type(self) -> ErrorType {
        use StanzaErrorCondition::*;
        match self {
            BadRequest | JidMalformed | NotAcceptable | PolicyViolation | Redirect => {
                ErrorType::Modify
            }
            NotAuthorized | Forbidden | RegistrationRequired | SubscriptionRequired => {
                ErrorType::Auth
            }
            RecipientUnavailable | RemoteServerTimeout | ResourceConstraint | UnexpectedRequest => {
                ErrorType::Wait
            }
            InternalServerError => ErrorType::Cancel,
            _ => ErrorType::Cancel,
        }
    }
}

/// A stanza error (RFC 6120 §8.3): condition, type and optional text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StanzaError {
    /// The defined condition.
    pub condition: StanzaErrorCondition,
    /// The error type.
    pub kind: ErrorType,
    /// Human-readable text, in English.
    pub text: Option<String>,
    /// An application-specific condition (RFC 6120 §8.3.2: an element in
    /// another namespace beside the defined one, such as XEP-0060's
    /// `<precondition-not-met/>`).
    pub app: Option<Box<Element>>,
}

impl StanzaError {
    /// An error with the condition's default type and no text.
    pub fn new(condition: StanzaErrorCondition) -> Self {
        StanzaError {
            condition,
            kind: condition.default_type(),
            text: None,
            app: None,
        }
    }

    /// Adds an application-specific condition element.
    pub fn with_app(mut self, el: Element) -> Self {
        self.app = Some(Box::new(el));
        self
    }

    /// Adds descriptive text.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    /// Overrides the error type.
    pub fn with_type(mut self, kind: ErrorType) -> Self {
        self.kind = kind;
        self
    }

    /// The `<error/>` child element.
    pub fn to_element(&self) -> Element {
        let mut error = Element::builder("error", ns::CLIENT)
            .attr("type", self.kind.as_str())
            .build();
        error.append_child(Element::new(self.condition.as_str(), ns::STANZAS));
        if let Some(text) = &self.text {
            let mut t = Element::builder("text", ns::STANZAS)
                .attr("xml:lang", "en")
                .build();
            t.append_text(text.clone());
            error.append_child(t);
        }
        if let Some(app) = &self.app {
            error.append_child((**app).clone());
        }
        error
    }
}

impl std::fmt::Display for StanzaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.condition, self.kind.as_str())?;
        if let Some(t) = &self.text {
            write!(f, ": {t}")?;
        }
        Ok(())
    }
}

impl From<StanzaErrorCondition> for StanzaError {
    fn from(c: StanzaErrorCondition) -> Self {
        StanzaError::new(c)
    }
}

/// A stream error (RFC 6120 §4.9): always fatal for the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamError {
    /// The defined condition.
    pub condition: StreamErrorCondition,
    /// Human-readable text, in English, telling the peer what went wrong.
    pub text: Option<String>,
    /// An application-specific condition (RFC 6120 §4.9.4), e.g. XEP-0198's
    /// `<handled-count-too-high/>`.
    pub app: Option<Box<Element>>,
}

impl StreamError {
    /// A stream error with no text.
    pub fn new(condition: StreamErrorCondition) -> Self {
        StreamError {
            condition,
            text: None,
            app: None,
        }
    }

    /// A stream error with descriptive text.
    pub fn with_text(condition: StreamErrorCondition, text: impl Into<String>) -> Self {
        StreamError {
            condition,
            text: Some(text.into()),
            app: None,
        }
    }

    /// Adds an application-specific condition element (§4.9.4).
    pub fn with_app(mut self, el: Element) -> Self {
        self.app = Some(Box::new(el));
        self
    }

    /// The `<stream:error/>` element (RFC 6120 §4.9.2).
    pub fn to_element(&self) -> Element {
        let mut e = Element::new("error", ns::STREAMS);
        e.append_child(Element::new(self.condition.as_str(), ns::STREAM_ERRORS));
        if let Some(text) = &self.text {
            let mut t = Element::builder("text", ns::STREAM_ERRORS)
                .attr("xml:lang", "en")
                .build();
            t.append_text(text.clone());
            e.append_child(t);
        }
        if let Some(app) = &self.app {
            e.append_child((**app).clone());
        }
        e
    }
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.condition.as_str())?;
        if let Some(t) = &self.text {
            write!(f, ": {t}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stanza_error_service_unavailable_is_cancel() {
        // RFC 6120 §8.3.3.19 example uses type='cancel'.
        let e = StanzaError::new(StanzaErrorCondition::ServiceUnavailable).to_element();
        assert_eq!(e.attr("type"), Some("cancel"));
        assert!(e.has_child("service-unavailable", ns::STANZAS));
    }

    #[test]
    fn stream_error_text_serialised_with_lang() {
        let e = StreamError::with_text(StreamErrorCondition::PolicyViolation, "too big");
        let s = e.to_element().to_string();
        assert!(s.contains("policy-violation"), "{s}");
        assert!(s.contains("too big"), "{s}");
    }

    #[test]
    fn condition_roundtrip_all_names() {
        for c in [
            "bad-request",
            "service-unavailable",
            "recipient-unavailable",
        ] {
            assert_eq!(StanzaErrorCondition::from_str(c).unwrap().as_str(), c);
        }
        assert_eq!(
            StreamErrorCondition::from_str("system-shutdown"),
            Some(StreamErrorCondition::SystemShutdown)
        );
    }
}
