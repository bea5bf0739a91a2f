"""umT5-XXL text encoder maths and the reference's prompt constants."""
