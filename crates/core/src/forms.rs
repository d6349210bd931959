//! XEP-0004 data forms: reading a submitted form and building one, for
//! modules that configure things with forms (group-chat rooms, later
//! pubsub nodes).

use starling_proto::ns;
use starling_xml::Element;

/// A form as submitted (`<x xmlns='jabber:x:data'/>`): its type and each
/// field's values, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Submitted {
    /// The form's `type` (`submit`, `cancel`, `form`, `result`).
    pub kind: String,
    fields: Vec<(String, Vec<String>)>,
}

/// A field value a form cannot take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("field {var}: {problem}")]
pub struct FieldError {
    /// The field.
    pub var: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl Submitted {
    /// Reads a form element (anything that is not a field is ignored).
    pub fn parse(x: &Element) -> Submitted {
        let fields = x
            .children()
            .filter(|c| c.is("field", ns::DATA_FORMS))
            .filter_map(|f| {
                let var = f.attr("var")?.to_owned();
                let values = f
                    .children()
                    .filter(|v| v.is("value", ns::DATA_FORMS))
                    .map(|v| v.text())
                    .collect();
                Some((var, values))
            })
            .collect();
        Submitted {
            kind: x.attr("type").unwrap_or("").to_owned(),
            fields,
        }
    }

    /// The `FORM_TYPE` hidden field's value, if any.
    pub fn form_type(&self) -> Option<&str> {
        self.values("FORM_TYPE")
            .and_then(|v| v.first())
            .map(|s| s.trim())
    }

    /// The field's values, if the field is present (the last occurrence).
    pub fn values(&self, var: &str) -> Option<&[String]> {
        self.fields
            .iter()
            .rev()
            .find(|(v, _)| v == var)
            .map(|(_, values)| values.as_slice())
    }

    /// The names of the fields present, in order.
    pub fn vars(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(v, _)| v.as_str())
    }

    /// A single-valued field: `None` when absent, the empty string when
    /// present without a value; an error when it has several.
    pub fn single(&self, var: &str) -> Result<Option<&str>, FieldError> {
        match self.values(var) {
            None => Ok(None),
            Some([]) => Ok(Some("")),
            Some([one]) => Ok(Some(one.as_str())),
            Some(_) => Err(FieldError {
                var: var.to_owned(),
                problem: "takes a single value",
            }),
        }
    }

    /// A boolean field (XEP-0004 §3.3: `1`/`true`, `0`/`false`).
    pub fn boolean(&self, var: &str) -> Result<Option<bool>, FieldError> {
        match self.single(var)?.map(str::trim) {
            None => Ok(None),
            Some("1" | "true") => Ok(Some(true)),
            Some("0" | "false") => Ok(Some(false)),
            Some(_) => Err(FieldError {
                var: var.to_owned(),
                problem: "is a boolean: 1, true, 0 or false",
            }),
        }
    }
}

/// Builds a form (`type='form'` or `'result'`).
pub struct FormBuilder {
    el: Element,
}

impl FormBuilder {
    /// A form of type `kind` with a hidden `FORM_TYPE` when given.
    pub fn new(kind: &str, form_type: Option<&str>) -> FormBuilder {
        let mut b = FormBuilder {
            el: Element::builder("x", ns::DATA_FORMS)
                .attr("type", kind)
                .build(),
        };
        if let Some(t) = form_type {
            b = b.field("FORM_TYPE", "hidden", None, &[t]);
        }
        b
    }

    /// Adds a `<title/>`.
    pub fn title(mut self, text: &str) -> FormBuilder {
        self.el
            .append_child(Element::builder("title", ns::DATA_FORMS).text(text).build());
        self
    }

    /// Adds `<instructions/>`.
    pub fn instructions(mut self, text: &str) -> FormBuilder {
        self.el.append_child(
            Element::builder("instructions", ns::DATA_FORMS)
                .text(text)
                .build(),
        );
        self
    }

    /// Adds a field of type `ty` with a label and values.
    pub fn field(self, var: &str, ty: &str, label: Option<&str>, values: &[&str]) -> FormBuilder {
        self.field_with_options(var, ty, label, values, &[])
    }

    /// Adds a boolean field.
    pub fn boolean(self, var: &str, label: &str, value: bool) -> FormBuilder {
        self.field(
            var,
            "boolean",
            Some(label),
            &[if value { "1" } else { "0" }],
        )
    }

    /// Adds a field with `<option/>`s (`(label, value)`).
    pub fn field_with_options(
        mut self,
        var: &str,
        ty: &str,
        label: Option<&str>,
        values: &[&str],
        options: &[(&str, &str)],
    ) -> FormBuilder {
        let mut f = Element::builder("field", ns::DATA_FORMS)
            .attr("var", var)
            .attr("type", ty)
            .build();
        if let Some(l) = label {
            f.set_attr("label", l);
        }
        for v in values {
            f.append_child(Element::builder("value", ns::DATA_FORMS).text(*v).build());
        }
        for (l, v) in options {
            f.append_child(
                Element::builder("option", ns::DATA_FORMS)
                    .attr("label", *l)
                    .append(Element::builder("value", ns::DATA_FORMS).text(*v).build())
                    .build(),
            );
        }
        self.el.append_child(f);
        self
    }

    /// The form element.
    pub fn build(self) -> Element {
        self.el
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_forms_read_back() {
        let x = FormBuilder::new("submit", Some("urn:example"))
            .boolean("b", "B", true)
            .field("m", "text-multi", None, &["one", "two"])
            .field("e", "text-single", None, &[])
            .build();
        let f = Submitted::parse(&x);
        assert_eq!(f.kind, "submit");
        assert_eq!(f.form_type(), Some("urn:example"));
        assert_eq!(f.boolean("b"), Ok(Some(true)));
        assert_eq!(f.values("m").unwrap(), ["one", "two"]);
        assert!(f.single("m").is_err());
        assert_eq!(f.single("e"), Ok(Some("")));
        assert_eq!(f.single("absent"), Ok(None));
        assert!(f.boolean("m").is_err());
        assert_eq!(f.vars().count(), 4);
    }
}
